"""Non-visual (SimReady) material labels, the MaterialId encoding and wsim's default lidar reflectance table.

MaterialId (uint32, low 16 bits used) = base | (coating << 8) | (attribute_bits << 11).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

BASES: tuple[str, ...] = (
    "none", "aluminum", "steel", "oxidized_steel", "iron", "oxidized_iron", "silver", "brass", "bronze",
    "oxidized_bronze_patina", "tin", "plastic", "fiberglass", "carbon_fiber", "vinyl", "plexiglass", "pvc", "nylon",
    "polyester", "clear_glass", "frosted_glass", "one_way_mirror", "mirror", "ceramic_glass", "asphalt", "concrete",
    "leaf_grass", "dead_leaf_grass", "rubber", "wood", "bark", "cardboard", "paper", "fabric", "skin", "fur_hair",
    "leather", "marble", "brick", "stone", "gravel", "dirt", "mud", "water", "salt_water", "snow", "ice",
    "calibration_lambertian",
)
COATINGS: tuple[str, ...] = ("none", "paint", "clearcoat", "paint_clearcoat")
ATTRIBUTES: dict[str, int] = {"emissive": 1, "retroreflective": 2, "single_sided": 4, "visually_transparent": 8}
_ALIASES = {"calibration_lambertion": "calibration_lambertian"}

# Default near-infrared (905 nm) diffuse reflectance per base material, in [0, 1].
# Measured anchors (ASTER spectral library, % reflectance at 905 nm): asphaltic concrete 27.8, weathered aluminum 59.6,
# pine wood 91.8 (bare, we use 0.6 for weathered/painted wood), green grass 50.9, dry grass 59.8, deciduous leaves 55.4,
# slate 18.9 (stone). Everything else is a plausible value chosen by wsim; `wsim:reflectance` on a material overrides it.
DEFAULT_REFLECTANCE: dict[str, float] = {
    "none": 0.2, "aluminum": 0.596, "steel": 0.45, "oxidized_steel": 0.3, "iron": 0.4, "oxidized_iron": 0.25,
    "silver": 0.9, "brass": 0.6, "bronze": 0.5, "oxidized_bronze_patina": 0.3, "tin": 0.6, "plastic": 0.4,
    "fiberglass": 0.4, "carbon_fiber": 0.08, "vinyl": 0.35, "plexiglass": 0.08, "pvc": 0.4, "nylon": 0.5,
    "polyester": 0.5, "clear_glass": 0.08, "frosted_glass": 0.3, "one_way_mirror": 0.5, "mirror": 0.9,
    "ceramic_glass": 0.2, "asphalt": 0.278, "concrete": 0.35, "leaf_grass": 0.509, "dead_leaf_grass": 0.598,
    "rubber": 0.05, "wood": 0.6, "bark": 0.45, "cardboard": 0.6, "paper": 0.7, "fabric": 0.5, "skin": 0.55,
    "fur_hair": 0.4, "leather": 0.4, "marble": 0.6, "brick": 0.4, "stone": 0.189, "gravel": 0.25, "dirt": 0.3,
    "mud": 0.15, "water": 0.02, "salt_water": 0.02, "snow": 0.8, "ice": 0.3, "calibration_lambertian": 0.5,
}
# Fraction of the beam a surface lets through (continuing IDEALIZED rays); everything not listed is opaque.
DEFAULT_TRANSMITTANCE: dict[str, float] = {"clear_glass": 0.9, "plexiglass": 0.85, "frosted_glass": 0.3, "water": 0.0}
# Reflectance multiplier of a paint coating (painted surfaces follow the paint, not the substrate).
PAINT_REFLECTANCE = 0.5


def _norm(name: str) -> str:
    key = name.strip().lower()
    return _ALIASES.get(key, key)


def encode_material_id(base: str | int, coating: str | int = 0, attributes: Iterable[str] | int = ()) -> int:
    """Encode SimReady labels as a MaterialId: ``base | coating << 8 | attribute_bits << 11``.

    Args:
        base: Base material name (case-insensitive) or index 0..47.
        coating: Coating name or index 0..7.
        attributes: Attribute names (emissive, retroreflective, single_sided, visually_transparent) or their bit mask.

    Raises:
        ValueError: For an unknown name; the message names the label.
    """
    b = base if isinstance(base, int) else _index(BASES, base, "base")
    c = coating if isinstance(coating, int) else _index(COATINGS, coating or "none", "coating")
    if isinstance(attributes, int):
        bits = attributes
    else:
        bits = 0
        for a in attributes:
            key = _norm(a)
            if not key:
                continue
            if key not in ATTRIBUTES:
                raise ValueError(f"unknown omni:simready:nonvisual:attributes value {a!r}; known: {sorted(ATTRIBUTES)}")
            bits |= ATTRIBUTES[key]
    if not 0 <= b < 256 or not 0 <= c < 8 or not 0 <= bits < 32:
        raise ValueError(f"MaterialId fields out of range: base={b}, coating={c}, attributes={bits}")
    return b | (c << 8) | (bits << 11)


def decode_material_id(material_id: int) -> tuple[str, str, tuple[str, ...]]:
    """Inverse of :func:`encode_material_id`: (base name, coating name, attribute names)."""
    b, c, bits = material_id & 0xFF, (material_id >> 8) & 0x7, (material_id >> 11) & 0x1F
    base = BASES[b] if b < len(BASES) else f"base{b}"
    coating = COATINGS[c] if c < len(COATINGS) else f"coating{c}"
    return base, coating, tuple(n for n, v in ATTRIBUTES.items() if bits & v)


def _index(table: tuple[str, ...], name: str, field: str) -> int:
    key = _norm(name)
    if key not in table:
        raise ValueError(f"unknown omni:simready:nonvisual:{field} value {name!r}")
    return table.index(key)


@dataclass
class Material:
    """A surface material as wsim uses it.

    Attributes:
        name: Material prim path or name.
        base_color: Linear RGB diffuse colour in [0, 1].
        material_id: Encoded SimReady MaterialId (see :func:`encode_material_id`).
        reflectance: Near-infrared diffuse reflectance in [0, 1] used by the lidar.
        transmittance: Fraction of a lidar beam passed through the surface, in [0, 1].
        texture: Optional path of a diffuse texture image (sampled with the mesh UVs).
    """

    name: str
    base_color: tuple[float, float, float] = (0.5, 0.5, 0.5)
    material_id: int = 0
    reflectance: float = 0.2
    transmittance: float = 0.0
    texture: str | None = None

    @classmethod
    def from_labels(
        cls,
        name: str,
        base: str = "none",
        coating: str = "none",
        attributes: Iterable[str] = (),
        *,
        base_color: tuple[float, float, float] = (0.5, 0.5, 0.5),
        reflectance: float | None = None,
        transmittance: float | None = None,
        texture: str | None = None,
    ) -> Material:
        """Build a material from SimReady labels, filling reflectance/transmittance from the default tables."""
        attributes = tuple(attributes)
        mid = encode_material_id(base, coating, attributes)
        b, c, attrs = decode_material_id(mid)
        if reflectance is None:
            reflectance = PAINT_REFLECTANCE if c in ("paint", "paint_clearcoat") else DEFAULT_REFLECTANCE.get(b, 0.2)
        if transmittance is None:
            transmittance = DEFAULT_TRANSMITTANCE.get(b, 0.0)
            if "visually_transparent" in attrs and transmittance == 0.0:
                transmittance = 0.9
        return cls(name, tuple(float(x) for x in base_color), mid, float(reflectance), float(transmittance), texture)
