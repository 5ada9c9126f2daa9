"""Warp kernels and functions (device code only: no file I/O, no NumPy, no USD)."""
