"""What the USD reader (:mod:`wsim.scene.usd_read`) and writer (:mod:`wsim.scene.usd_write`) share: access to pxr, the
stage-unit / up-axis and camera-axes conventions, attribute reads and pxr's error messages. The conventions themselves
are listed in :mod:`wsim.scene.usd`."""

from __future__ import annotations

import os
import re

import numpy as np

#: timeCodesPerSecond of stages written by :func:`save_usd`.
TIME_CODES_PER_SECOND = 1000.0
# 180° about X: USD camera axes (x right, y up, z backward) <-> OpenCV camera axes (x right, y down, z forward).
_RX180 = np.diag([1.0, -1.0, -1.0, 1.0])


def _pxr():
    try:
        from pxr import Gf, Sdf, Usd, UsdGeom, UsdShade, Vt
    except ImportError as e:  # pragma: no cover - usd-core is a hard dependency
        raise ImportError("wsim.scene.usd needs usd-core (pip install usd-core)") from e
    return Gf, Sdf, Usd, UsdGeom, UsdShade, Vt


def _col(m) -> np.ndarray:
    """pxr row-vector matrix (p' = p·M) → numpy column-vector matrix (p' = M p)."""
    return np.array(m, dtype=np.float64).reshape(4, 4).T


def _transform_points(m: np.ndarray, p: np.ndarray) -> np.ndarray:
    return p @ m[:3, :3].T + m[:3, 3]


def _up_matrix(up_axis: str, meters_per_unit: float) -> np.ndarray:
    """Stage coordinates → wsim coordinates (metres, Z up)."""
    c = np.diag([meters_per_unit] * 3 + [1.0])
    if str(up_axis).upper() == "Y":
        r = np.array([[1, 0, 0, 0], [0, 0, -1, 0], [0, 1, 0, 0], [0, 0, 0, 1]], dtype=np.float64)
        c = r @ c
    return c


def _attr_value(prim, name: str):
    a = prim.GetAttribute(name)
    if a and a.HasAuthoredValue():
        return a.Get()
    return None


def pxr_error_message(e: BaseException, file: str = "") -> str:
    """The first meaningful line of a pxr error (Tf.ErrorException): the innermost error's own text, without the
    "Error in 'pxrInternal_...::Function' at line N in file stage.cpp" prefixes, C++ namespaces or parser rule names,
    and with the file's own path (``file``) shortened to a line and column."""
    text = str(e)
    parts = [m.strip() for m in re.split(r"Error in '[^']*' at line \d+ in file [^\n]*? : '", text)[1:]]
    parts = [(m[:-1] if m.endswith("'") else m).strip() for m in parts]  # each message closes with its quote
    msg = next((m for m in parts if m), text.strip().splitlines()[0] if text.strip() else type(e).__name__)
    msg = re.sub(r"pxrInternal_v\w+?__pxrReserved__::", "", msg)
    msg = re.sub(r" matching \S+ at ", " at ", msg)  # parse error matching Sdf_TextFileFormatParser::Rule at '}'
    if file:
        for f in sorted({file, os.path.abspath(file), os.path.realpath(file)}, key=len, reverse=True):
            msg = re.sub(re.escape(f) + r":(\d+):(\d+): ", r"line \1, column \2: ", msg)
            msg = msg.replace(f"<{f}> is ", "").replace(f"@{f}@", "").replace(f"<{f}>", "the file")
    return " ".join(msg.split()) or type(e).__name__
