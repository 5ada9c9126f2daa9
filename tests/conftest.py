"""Shared fixtures: every test that takes ``device`` runs on each available Warp device (the CPU always)."""

from __future__ import annotations

import numpy as np
import pytest
import warp as wp

wp.config.quiet = True
wp.init()

DEVICES = ["cpu"] + [str(d) for d in wp.get_cuda_devices()]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def box_mesh(lo, hi, inward: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """12-triangle axis-aligned box from corner ``lo`` to ``hi``; normals outward (or inward)."""
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    p = np.array([[x, y, z] for z in (lo[2], hi[2]) for y in (lo[1], hi[1]) for x in (lo[0], hi[0])])
    f = np.array([
        [0, 2, 1], [1, 2, 3],  # z-
        [4, 5, 6], [5, 7, 6],  # z+
        [0, 1, 4], [1, 5, 4],  # y-
        [2, 6, 3], [3, 6, 7],  # y+
        [0, 4, 2], [2, 4, 6],  # x-
        [1, 3, 5], [3, 7, 5],  # x+
    ])
    if inward:
        f = f[:, ::-1]
    return p, f


def quad_mesh(center, u, v) -> tuple[np.ndarray, np.ndarray]:
    """Two-triangle parallelogram centred at ``center`` with half-edge vectors ``u`` and ``v`` (normal u × v)."""
    c, u, v = (np.asarray(a, float) for a in (center, u, v))
    p = np.array([c - u - v, c + u - v, c + u + v, c - u + v])
    return p, np.array([[0, 1, 2], [0, 2, 3]])
