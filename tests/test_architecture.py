"""The house stays as drawn (README "Architecture", ARCHITECTURE.md): which room may import what, and no circles.

Static and fast: every module under ``wsim/`` is parsed with :mod:`ast`, nothing is imported. Every import counts —
module level, inside functions, under ``if TYPE_CHECKING``, and ``__import__`` / ``importlib.import_module`` calls
with a literal name — so a lazy import cannot hide a dependency. The one place the two kinds differ is the cycle
check: module-level imports must form no cycle at all (that is what Python runs at import time), and imports of either
kind must form none either (a function-local import is still an arrow in the drawing).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "wsim"

#: Rooms by module-name prefix (longest match wins) and their layer. A module may import its own room and rooms of a
#: lower layer only; rooms of the same layer do not import each other.
ROOMS: dict[str, tuple[str, int]] = {
    "wsim.kernels": ("kernels", 0),   # Warp code: @wp.func / @wp.kernel
    "wsim.launch": ("launch", 0),     # kernel launching: CPU sharding, cancellation (imports warp only)
    "wsim.scene": ("scene", 1),       # loading and holding scenes, device geometry, every USD read/write
    "wsim.sensors": ("sensors", 2),   # Lidar, Camera, lenses, PointCloud and images
    "wsim": ("api", 3),               # wsim/__init__.py: the public surface re-exported from scene and sensors
    "wsim.autodiff": ("autodiff", 4),  # autograd bridges over wp.Tape (torch)
    "wsim.torch": ("autodiff", 4),    # the torch-facing names of wsim.autodiff
    "wsim.grpc": ("grpc", 4),         # protos, stubs, servicer, server
    "wsim.dataset": ("dataset", 4),   # wsim dataset: specs, shards, workers / Ray, MCAP and folder writers
    "wsim.cli": ("cli", 5),           # the wsim command
}

#: Third-party packages confined to rooms: top-level import name → rooms allowed to import it.
CONFINED: dict[str, set[str]] = {
    "pxr": {"scene"},  # USD types never leave wsim/scene; sensors read their prims through a reader there
    "grpc": {"grpc"},
    "grpc_tools": {"grpc"},
    "google.protobuf": {"grpc"},  # protobuf types never leave wsim/grpc
    "torch": {"autodiff"},
    "mcap": {"dataset"},
    "foxglove": {"dataset"},
    "ray": {"dataset"},
}

#: Function-local imports of a confined package outside its rooms, each with the reason it may stay.
CONFINED_LOCAL_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("wsim.sensors.pointcloud", "torch"): "PointCloud.torch(): the zero-copy torch view of a product that "
    "ARCHITECTURE.md draws (numpy · torch); local, so torch stays optional and `import wsim` never loads it",
}

#: Import cycles allowed to remain (sorted tuple of module names → reason). None today.
ALLOWED_CYCLES: dict[tuple[str, ...], str] = {}


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (wsim modules resolved to a module or package of wsim) or third-party name
    line: int
    local: bool  # inside a function (runs when called, not at import)

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}{' (function-local)' if self.local else ''}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _resolve(name: str) -> str:
    """A wsim name → the longest module prefix that exists; other names unchanged."""
    if name != "wsim" and not name.startswith("wsim."):
        return name
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in MODULES:
            return cand
    return name


def _imports(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[Import] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend(Import(module, _resolve(a.name), child.lineno, local) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    full = ".".join(base + ([child.module] if child.module else []))
                else:
                    full = child.module or ""
                targets = {f"{full}.{a.name}" if f"{full}.{a.name}" in MODULES else _resolve(full)
                           for a in child.names}  # `from pkg import submodule` imports the submodule
                out.extend(Import(module, t, child.lineno, local) for t in sorted(targets))
            elif isinstance(child, ast.Call) and child.args and isinstance(child.args[0], ast.Constant) \
                    and isinstance(child.args[0].value, str) and (
                        (isinstance(child.func, ast.Name) and child.func.id == "__import__")
                        or (isinstance(child.func, ast.Attribute) and child.func.attr == "import_module")):
                out.append(Import(module, _resolve(child.args[0].value), child.lineno, local))
            visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return out


IMPORTS = [imp for name, path in MODULES.items() for imp in _imports(name, path)]


def _room(module: str) -> tuple[str, int]:
    best = max((p for p in ROOMS if module == p or module.startswith(p + ".")), key=len, default=None)
    if best is None:
        raise KeyError(module)
    return ROOMS[best]


def _top(name: str) -> str:
    """The CONFINED key a third-party import name falls under ('' when none)."""
    return next((k for k in CONFINED if name == k or name.startswith(k + ".")), "")


def _cycles(edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Strongly connected components with more than one module (or a module importing itself), Tarjan."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[tuple[str, ...]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                found.append(tuple(sorted(comp)))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


def _graph(local: bool) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in IMPORTS:
        if imp.target in MODULES and imp.target != imp.source and (local or not imp.local):
            edges[imp.source].add(imp.target)
    return edges


# ----------------------------------------------------------------------------------------------------------------------


def test_the_parser_sees_the_package() -> None:
    """Guards the rest: the walk finds the rooms, relative imports resolve, and local imports are told apart."""
    assert {"wsim", "wsim.scene.scene", "wsim.scene.geometry", "wsim.kernels.trace", "wsim.grpc.service"} <= set(MODULES)
    geo = {i.target for i in IMPORTS if i.source == "wsim.scene.geometry" and not i.local}
    assert {"wsim.scene.scene", "wsim.kernels.trace", "wsim.launch"} <= geo
    assert any(i.source == "wsim.scene.loader" and i.target == "wsim.scene.usd" and i.local for i in IMPORTS)
    assert any(i.source == "wsim.cli" and i.target == "wsim.grpc.server" for i in IMPORTS)  # __import__("...")


def test_every_module_is_in_a_room() -> None:
    homeless = []
    for m in MODULES:
        try:
            _room(m)
        except KeyError:
            homeless.append(m)
    assert not homeless, f"modules outside every room (add them to ROOMS and the README's Architecture): {homeless}"


def test_rooms_import_only_downwards() -> None:
    """kernels, launch → scene → sensors → wsim (public surface) → autodiff | grpc → cli; no arrow back up or across."""
    bad = []
    for imp in IMPORTS:
        if imp.target not in MODULES:
            continue
        (src_room, src_layer), (dst_room, dst_layer) = _room(imp.source), _room(imp.target)
        if src_room != dst_room and dst_layer >= src_layer:
            bad.append(f"{imp}: {src_room} (layer {src_layer}) → {dst_room} (layer {dst_layer})")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", sorted(CONFINED))
def test_third_party_packages_stay_in_their_rooms(package: str) -> None:
    bad = []
    for imp in IMPORTS:
        if _top(imp.target) != package or _room(imp.source)[0] in CONFINED[package]:
            continue
        if imp.local and (imp.source, package) in CONFINED_LOCAL_EXCEPTIONS:
            continue
        bad.append(str(imp))
    rooms = ", ".join(sorted(CONFINED[package]))
    assert not bad, f"{package} may be imported only in {rooms}:\n" + "\n".join(bad)


def test_confined_exceptions_are_still_needed() -> None:
    """An exception whose import has gone is removed from the list, so the list stays the truth."""
    stale = [key for key in CONFINED_LOCAL_EXCEPTIONS
             if not any(i.source == key[0] and _top(i.target) == key[1] and i.local for i in IMPORTS)]
    assert not stale, f"CONFINED_LOCAL_EXCEPTIONS entries without their import: {stale}"


def test_kernels_import_neither_numpy_nor_pxr() -> None:
    bad = [str(i) for i in IMPORTS if _room(i.source)[0] == "kernels"
           and i.target.split(".")[0] in ("numpy", "pxr")]
    assert not bad, "Warp kernels never import numpy or pxr:\n" + "\n".join(bad)


def test_scene_is_a_plain_host_description() -> None:
    """wsim.scene.scene knows nothing of the device: the geometry (and its cache) lives with SceneGeometry."""
    bad = [str(i) for i in IMPORTS if i.source == "wsim.scene.scene"
           and (i.target.split(".")[0] == "warp" or i.target == "wsim.scene.geometry")]
    assert not bad, "\n".join(bad)


def test_no_import_cycles_at_module_level() -> None:
    cycles = _cycles(_graph(local=False))
    assert not cycles, f"module-level import cycles: {cycles}"


def test_no_import_cycles_counting_function_local_imports() -> None:
    cycles = [c for c in _cycles(_graph(local=True)) if c not in ALLOWED_CYCLES]
    assert not cycles, f"import cycles (function-local imports included): {cycles}"
    stale = [c for c in ALLOWED_CYCLES if c not in _cycles(_graph(local=True))]
    assert not stale, f"ALLOWED_CYCLES entries that are no longer cycles: {stale}"
