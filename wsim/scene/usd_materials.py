"""Materials on USD stages, read and written: a bound ``UsdShade.Material`` → :class:`~wsim.scene.materials.Material`
(``UsdPreviewSurface`` diffuse colour or the file of a ``UsdUVTexture`` connected to it, the SimReady non-visual labels,
the ``wsim:reflectance`` / ``wsim:transmittance`` overrides), and a scene's material table → ``/World/Looks``."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable

from .materials import Material, decode_material_id
from .scene import Scene, SceneError
from .usd_stage import _attr_value

_NONVISUAL_PREFIXES = ("omni:simready:nonvisual:", "inputs:nonvisual:")


def _split_labels(v) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [s.strip() for s in re.split(r"[,;\s]+", v) if s.strip()]
    out: list[str] = []
    for x in v:
        out.extend(_split_labels(str(x)))
    return out


def read_material(mat, file: str, base_dir: Path) -> tuple[Material, bool]:
    """The :class:`Material` of a ``UsdShade.Material`` and whether the stage gives it a colour (a diffuse value or a
    texture). Relative texture paths are resolved against ``base_dir``; errors name ``file`` and the material."""
    from pxr import Sdf, UsdShade

    prim = mat.GetPrim()
    path = str(prim.GetPath())
    labels: dict[str, Any] = {}
    for key in ("base", "coating", "attributes"):
        for prefix in _NONVISUAL_PREFIXES:
            v = _attr_value(prim, prefix + key)
            if v is not None:
                labels[key] = v
                break
    refl = _attr_value(prim, "wsim:reflectance")
    trans = _attr_value(prim, "wsim:transmittance")
    color, texture, has_color = (0.5, 0.5, 0.5), None, False
    try:
        shader = mat.ComputeSurfaceSource()
        shader = shader[0] if isinstance(shader, tuple) else shader
    except Exception:  # noqa: BLE001
        shader = None
    if shader and shader.GetPrim().IsValid():
        inp = shader.GetInput("diffuseColor")
        if inp:
            for attr in inp.GetValueProducingAttributes():
                if UsdShade.Output.IsOutput(attr):
                    src = UsdShade.Shader(attr.GetPrim())
                    f = src.GetInput("file")
                    fv = f.Get() if f else None
                    if isinstance(fv, Sdf.AssetPath) and fv.path:
                        texture = fv.resolvedPath or fv.path
                        if not os.path.isabs(texture):
                            texture = str((base_dir / texture).resolve())
                        has_color = True
                    break
                v = attr.Get()
                if v is not None:
                    color, has_color = tuple(float(x) for x in v), True
                    break
    try:
        m = Material.from_labels(
            path,
            str(labels.get("base") or "none"),
            str(labels.get("coating") or "none"),
            _split_labels(labels.get("attributes")),
            base_color=color,
            reflectance=None if refl is None else float(refl),
            transmittance=None if trans is None else float(trans),
            texture=texture,
        )
    except ValueError as e:
        raise SceneError(f"{file}: material {path}: {e}") from e
    return m, has_color


def write_materials(stage, scene: Scene, unique: Callable[[str, str], str]) -> dict[int, Any]:
    """Define a ``UsdPreviewSurface`` material under ``/World/Looks`` for every material a part uses (but the default,
    index 0), with its SimReady labels and the reflectance / transmittance that differ from its labels' defaults.
    ``unique(parent, name)`` gives a free prim path. Returns material index → ``UsdShade.Material``."""
    from pxr import Gf, Sdf, UsdShade

    out: dict[int, Any] = {}
    used = {p.material for p in scene.parts}
    for i, m in enumerate(scene.materials):
        if i == 0 or i not in used:
            continue
        path = unique("/World/Looks", m.name.rsplit("/", 1)[-1] or f"material_{i}")
        mat = UsdShade.Material.Define(stage, path)
        sh = UsdShade.Shader.Define(stage, path + "/PreviewSurface")
        sh.CreateIdAttr("UsdPreviewSurface")
        diffuse = sh.CreateInput("diffuseColor", Sdf.ValueTypeNames.Color3f)
        diffuse.Set(Gf.Vec3f(*[float(x) for x in m.base_color]))
        sh.CreateInput("roughness", Sdf.ValueTypeNames.Float).Set(0.5)
        mat.CreateSurfaceOutput().ConnectToSource(sh.ConnectableAPI(), "surface")
        if m.texture:
            tex = UsdShade.Shader.Define(stage, path + "/DiffuseTexture")
            tex.CreateIdAttr("UsdUVTexture")
            tex.CreateInput("file", Sdf.ValueTypeNames.Asset).Set(Sdf.AssetPath(str(m.texture)))
            reader = UsdShade.Shader.Define(stage, path + "/STReader")
            reader.CreateIdAttr("UsdPrimvarReader_float2")
            reader.CreateInput("varname", Sdf.ValueTypeNames.String).Set("st")
            st_out = reader.CreateOutput("result", Sdf.ValueTypeNames.Float2)
            tex.CreateInput("st", Sdf.ValueTypeNames.Float2).ConnectToSource(st_out)
            rgb = tex.CreateOutput("rgb", Sdf.ValueTypeNames.Float3)
            diffuse.ConnectToSource(rgb)
        prim = mat.GetPrim()
        base, coating, attrs = decode_material_id(int(m.material_id))
        prim.CreateAttribute("omni:simready:nonvisual:base", Sdf.ValueTypeNames.Token, custom=True).Set(base)
        prim.CreateAttribute("omni:simready:nonvisual:coating", Sdf.ValueTypeNames.Token, custom=True).Set(coating)
        prim.CreateAttribute("omni:simready:nonvisual:attributes", Sdf.ValueTypeNames.TokenArray, custom=True).Set(
            list(attrs)
        )
        default = Material.from_labels(m.name, base, coating, attrs)
        if abs(default.reflectance - m.reflectance) > 1e-9:
            prim.CreateAttribute("wsim:reflectance", Sdf.ValueTypeNames.Float, custom=True).Set(m.reflectance)
        if abs(default.transmittance - m.transmittance) > 1e-9:
            prim.CreateAttribute("wsim:transmittance", Sdf.ValueTypeNames.Float, custom=True).Set(m.transmittance)
        out[i] = mat
    return out
