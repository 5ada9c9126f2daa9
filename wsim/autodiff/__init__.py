"""Gradients through wsim's sensors: PyTorch autograd functions over Warp tapes (see :mod:`wsim.torch`)."""
