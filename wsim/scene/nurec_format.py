"""Encodings shared by the NuRec reader (:mod:`wsim.scene.nurec_read`) and writer (:mod:`wsim.scene.nurec_write`):
PLY meshes, sRGB vertex colours, the run-length lists and the member name of the ``wsim_materials.json`` sidecar.
The artifact's layout is described in :mod:`wsim.scene.nurec`."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from .scene import MeshData, Scene, SceneError

SIDECAR = "wsim_materials.json"


# ---------------------------------------------------------------------------------------------------------------------
# colours and run-length lists


def srgb_to_linear(c: np.ndarray) -> np.ndarray:
    """sRGB-encoded values in [0, 1] → linear."""
    c = np.clip(np.asarray(c, dtype=np.float64), 0.0, 1.0)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def linear_to_srgb(c: np.ndarray) -> np.ndarray:
    """Linear values in [0, 1] → sRGB-encoded values in [0, 1]."""
    c = np.clip(np.asarray(c, dtype=np.float64), 0.0, 1.0)
    return np.where(c <= 0.0031308, c * 12.92, 1.055 * np.power(c, 1 / 2.4) - 0.055)


def rle_encode(values: np.ndarray) -> list[int]:
    """Run-length encode an int array as a flat ``[value, count, value, count, ...]`` list."""
    v = np.asarray(values, dtype=np.int64).ravel()
    if len(v) == 0:
        return []
    starts = np.concatenate([[0], np.nonzero(np.diff(v))[0] + 1])
    counts = np.diff(np.concatenate([starts, [len(v)]]))
    out = np.empty(2 * len(starts), dtype=np.int64)
    out[0::2] = v[starts]
    out[1::2] = counts
    return [int(x) for x in out]


def rle_decode(rle: list[int], max_length: int | None = None) -> np.ndarray:
    """Inverse of :func:`rle_encode`.

    Raises:
        ValueError: An odd or non-integer list, a negative run, or more than ``max_length`` values in all (checked
            before anything is expanded).
    """
    if not isinstance(rle, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in rle):
        raise ValueError("run-length list must hold integers")
    if len(rle) % 2:
        raise ValueError("run-length list has an odd number of entries")
    if len(rle) == 0:
        return np.zeros(0, dtype=np.int32)
    counts = rle[1::2]
    if min(counts) < 0:
        raise ValueError("negative run length")
    total = sum(counts)  # Python ints: no overflow
    if max_length is not None and total > max_length:
        raise ValueError(f"run-length list expands to {total:,} values, more than the {max_length:,} the meshes hold")
    a = np.asarray(rle, dtype=np.int64)
    if a[0::2].min() < np.iinfo(np.int32).min or a[0::2].max() > np.iinfo(np.int32).max:
        raise ValueError("run-length value out of the int32 range")
    return np.repeat(a[0::2], a[1::2]).astype(np.int32)


def _material_vertex_colors(scene: Scene, mesh: MeshData) -> np.ndarray:
    """Linear colour per vertex from the base colour of its triangles' material (the last triangle wins)."""
    mat_col = np.array([m.base_color for m in scene.materials], dtype=np.float64).reshape(-1, 3)
    part_mat = np.array([p.material for p in scene.parts], dtype=np.int64)
    tri_col = mat_col[part_mat[mesh.tri_part]] if len(mesh.tri_part) else np.zeros((0, 3))
    lin = np.full((len(mesh.points), 3), 0.5)
    lin[mesh.indices.reshape(-1)] = np.repeat(tri_col, 3, axis=0)
    return lin


# ---------------------------------------------------------------------------------------------------------------------
# PLY


def ply_bytes(points: np.ndarray, indices: np.ndarray, colors_u8: np.ndarray | None = None) -> bytes:
    """A binary little-endian PLY (float x, y, z, optional uchar red/green/blue; uchar+int face vertex_indices)."""
    points = np.asarray(points, dtype="<f4").reshape(-1, 3)
    indices = np.asarray(indices, dtype="<i4").reshape(-1, 3)
    head = ["ply", "format binary_little_endian 1.0", f"element vertex {len(points)}",
            "property float x", "property float y", "property float z"]
    vfields = [("x", "<f4"), ("y", "<f4"), ("z", "<f4")]
    if colors_u8 is not None:
        head += ["property uchar red", "property uchar green", "property uchar blue"]
        vfields += [("red", "u1"), ("green", "u1"), ("blue", "u1")]
    head += [f"element face {len(indices)}", "property list uchar int vertex_indices", "end_header"]
    v = np.empty(len(points), dtype=vfields)
    v["x"], v["y"], v["z"] = points[:, 0], points[:, 1], points[:, 2]
    if colors_u8 is not None:
        c = np.asarray(colors_u8, dtype=np.uint8).reshape(-1, 3)
        v["red"], v["green"], v["blue"] = c[:, 0], c[:, 1], c[:, 2]
    f = np.empty(len(indices), dtype=[("n", "u1"), ("i", "<i4", (3,))])
    f["n"] = 3
    f["i"] = indices
    return ("\n".join(head) + "\n").encode("ascii") + v.tobytes() + f.tobytes()


_PLY_TYPE_BYTES = {"char": 1, "uchar": 1, "int8": 1, "uint8": 1, "short": 2, "ushort": 2, "int16": 2, "uint16": 2,
                   "int": 4, "uint": 4, "int32": 4, "uint32": 4, "float": 4, "float32": 4, "double": 8,
                   "float64": 8}


def _check_ply_counts(data: bytes, where: str) -> None:
    """Refuse a PLY whose header promises more elements than its bytes can hold (before anything is allocated)."""
    end = data.find(b"end_header", 0, 1 << 16)
    if not data.startswith(b"ply") or end < 0:
        return  # not a PLY: the parser reports it
    binary = b"format binary" in data[:end]
    body = len(data) - end - len(b"end_header")
    elements: list[list] = []  # [name, count, minimal bytes per element]
    for line in data[:end].decode("ascii", "replace").splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "element":
            try:
                count = int(words[2])
            except ValueError:
                raise SceneError(f"{where}: PLY element {words[1]!r} has a non-integer count {words[2]!r}") from None
            if count < 0:
                raise SceneError(f"{where}: PLY element {words[1]!r} has a negative count")
            elements.append([words[1], count, 0])
        elif len(words) >= 3 and words[0] == "property" and elements:
            kind = words[2] if words[1] == "list" else words[1]  # a list holds at least its count
            elements[-1][2] += _PLY_TYPE_BYTES.get(kind, 1) if binary else 2  # ASCII: a digit and a separator
    need = sum(count * max(size, 1) for _, count, size in elements)
    if need > body:
        detail = ", ".join(f"{count:,} {name}" for name, count, _ in elements)
        raise SceneError(f"{where}: PLY header promises {detail}, at least {need:,} bytes, but the file holds {body:,}")


def read_ply_mesh(data: bytes, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Parse PLY bytes → (points (N,3) float32, triangles (M,3) int32, linear colours (N,3) float32 or None).

    Raises :class:`SceneError` naming ``where`` for unparsable data, NaN points or out-of-range face indices.
    """
    _check_ply_counts(data, where)
    # plyfile reads binary triangle lists fast only from a real (memory-mapped) file: go through a temporary file.
    with tempfile.TemporaryDirectory(prefix="wsim_ply_") as tmp:
        fname = Path(tmp) / "mesh.ply"
        fname.write_bytes(data)
        with open(fname, "rb") as fh:
            return _read_ply_stream(fh, where)


def _read_ply_stream(fh, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    from plyfile import PlyData

    try:
        try:
            ply = PlyData.read(fh, mmap="c", known_list_len={"face": {"vertex_indices": 3}})
        except Exception:  # noqa: BLE001 - not all faces are triangles: the general reader
            fh.seek(0)
            ply = PlyData.read(fh)
    except Exception as e:  # noqa: BLE001 - plyfile raises several types
        raise SceneError(f"{where}: not a readable PLY file ({e})") from e
    names = [el.name for el in ply.elements]
    if "vertex" not in names:
        raise SceneError(f"{where}: PLY has no 'vertex' element")
    vert = ply["vertex"].data
    vprops = vert.dtype.names or ()
    for axis in "xyz":
        if axis not in vprops:
            raise SceneError(f"{where}: PLY vertex element has no '{axis}' property")
    points = np.stack([np.array(vert[a], dtype=np.float64) for a in "xyz"], axis=1)
    bad = ~np.isfinite(points).all(axis=1)
    if np.any(bad):
        raise SceneError(f"{where}: non-finite (NaN/inf) vertex at index {int(np.argmax(bad))}")
    colors = None
    if all(c in vprops for c in ("red", "green", "blue")):
        raw = np.stack([np.array(vert[c]) for c in ("red", "green", "blue")], axis=1)
        if np.issubdtype(raw.dtype, np.integer):
            enc = raw.astype(np.float64) / 255.0
        else:
            enc = raw.astype(np.float64)
        colors = srgb_to_linear(enc).astype(np.float32)
    tris = np.zeros((0, 3), dtype=np.int64)
    if "face" in names:
        fdata = ply["face"].data
        fprops = fdata.dtype.names or ()
        key = "vertex_indices" if "vertex_indices" in fprops else ("vertex_index" if "vertex_index" in fprops else None)
        if key is None:
            raise SceneError(f"{where}: PLY face element has no 'vertex_indices' property")
        col = fdata[key]
        if len(col) and col.dtype != object and col.ndim == 2 and col.shape[1] == 3:
            tris = np.array(col, dtype=np.int64)  # a copy: the source may be memory-mapped
        elif len(col):
            polys = [np.asarray(f, dtype=np.int64).ravel() for f in col]
            out = []
            for fi, p in enumerate(polys):
                if len(p) < 3:
                    raise SceneError(f"{where}: face {fi} has fewer than 3 vertices")
                for k in range(1, len(p) - 1):
                    out.append((p[0], p[k], p[k + 1]))
            tris = np.asarray(out, dtype=np.int64).reshape(-1, 3)
    if len(tris):
        lo, hi = int(tris.min()), int(tris.max())
        if lo < 0 or hi >= len(points):
            face = int(np.argmax(((tris < 0) | (tris >= len(points))).any(axis=1)))
            raise SceneError(
                f"{where}: face {face} vertex index out of range [0, {len(points)}) (min {lo}, max {hi})"
            )
    return points.astype(np.float32), tris.astype(np.int32), colors
