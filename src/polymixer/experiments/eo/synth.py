"""An offline, seeded stand-in for PASTIS, written in exactly its layout and grounded in its published statistics
(docs/eo.md lists each figure with its source).

* **Tiles and dates** — patches belong to PASTIS's four Sentinel-2 tiles (T30UXV, T31TFJ, T31TFM, T32ULU). Each
  tile has one set of acquisition dates, shared by all its patches, drawn from the 5-day revisit grid between
  2018-09-01 and 2019-11-30; the tiles have 38, 46, 53 and 61 dates (``frames`` spread over the tiles: PASTIS has
  38–61 acquisitions per series).
* **Parcels** — Voronoi cells on a canvas twice the patch's side, each one field of one class: background (30% of
  the cells: forest, grassland, built-up, water) or one of the 18 crop types drawn with PASTIS's parcel counts
  (meadow 31,292 … sorghum 707). A crop parcel mostly outside the patch is void, PASTIS's rule for its void label.
* **Phenology** — each class is a season over the 15 months, in days since 2018-09-01, from the French crop
  calendar: winter crops sown in autumn 2018 and harvested in June–July 2019, spring and summer crops bare until
  March–June, meadows and fodder green all year and mown, vines and orchards leafing out over soil or grass. A
  season is a green-up, a senescence (dry canopy) and a harvest (stubble, bare soil, sometimes a cover crop).
  Classes differ by the shape and the months of their seasons and by the spectra of their canopy and soil, as
  crops do; the winter cereals share one shape and differ by one to three weeks and by their canopy's level.
* **Jitter** — a tile's climate shifts its seasons (σ 5 days), a parcel's sowing shifts its own (σ 7 days);
  peak greenness, soil brightness and the chance of a cover crop vary per parcel; within-field heterogeneity and
  sensor noise per pixel.
* **Clouds** — PASTIS keeps its cloudy acquisitions. A tile's cloud cover on a date is shared by its patches
  (``cloudy`` is its mean, 0.3 by default: no published figure for PASTIS was found); where a patch lies under the
  cloud is a smooth random field, with the cloud's shadow beside it.

Reflectances × 10⁴ of the 10 PASTIS bands (B2, B3, B4, B5, B6, B7, B8, B8A, B11, B12), mixed linearly from endmember
spectra and stored as int16. Patch k lies in tile ``(k // 5) % 4`` and fold ``1 + k % 5`` and draws its randomness
from ``numpy.random.default_rng([seed, k])``; tile j's dates and weather from ``default_rng([seed, 10**6 + j])``.
Files::

    metadata.geojson  (ID_PATCH, Fold, TILE, dates-S2, N_Parcel, Patch_Cover; square Lambert-93 geometries)
    DATA_S2/S2_<ID>.npy  ANNOTATIONS/TARGET_<ID>.npy (1, H, W)  ANNOTATIONS/ParcelIDs_<ID>.npy  NORM_S2_patch.json

The dataset is written into a temporary sibling folder renamed to ``root`` at the end: an interrupted run never
leaves half a dataset.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

from ..data.cache import build_folder, cached_default, resolve_folder
from .data import DEFAULTS, FOLDS, NUM_CLASSES, VOID, metadata_path

__all__ = ["VERSION", "TILES", "START", "END", "PARCEL_COUNTS", "SEASONS", "ENDMEMBERS", "Tile", "tile_frames",
           "make_tile", "make_patch", "write_synthetic_pastis", "default_data", "resolve_data"]

VERSION = 2
TILES = ("T30UXV", "T31TFJ", "T31TFM", "T32ULU")
START, END = dt.date(2018, 9, 1), dt.date(2019, 11, 30)  # PASTIS's acquisition period
REVISIT = 5  # days between two Sentinel-2 acquisitions of a place (S2A + S2B)
# PASTIS's number of parcels per crop type (pastis-benchmark, images/Nomenclature.png), classes 1 … 18
PARCEL_COUNTS = (31292, 8206, 13123, 2766, 1769, 908, 1355, 10640, 871, 1208, 1704, 2619, 551, 3174, 1212, 2998,
                 848, 707)
BACKGROUND_SHARE = 0.3  # of the Voronoi cells (an assumption: PASTIS publishes no background share)
CELL_AREA = 100.0  # mean Voronoi cell in pixels (PASTIS: at most 16,384 × 2,433 / 121,875 ≈ 330 per parcel)

# endmember reflectances × 10⁴ for B2, B3, B4, B5, B6, B7, B8, B8A, B11, B12
ENDMEMBERS: Dict[str, np.ndarray] = {k: np.array(v, np.float32) for k, v in {
    "cereal": (300, 600, 350, 1000, 2600, 3100, 3400, 3550, 2000, 1000),  # erectophile grass canopy
    "broadleaf": (250, 600, 250, 1050, 3200, 4000, 4400, 4550, 2200, 1000),  # planophile dicot canopy: higher NIR
    "grass": (300, 650, 380, 1100, 2700, 3200, 3500, 3650, 2100, 1100),
    "tree": (220, 450, 250, 750, 2200, 2700, 2950, 3050, 1500, 700),  # darker, shadowed crowns
    "dry": (900, 1150, 1400, 1700, 2000, 2200, 2300, 2400, 3300, 2700),  # senescent canopy, straw, stubble
    "flower": (500, 1300, 1100, 1600, 2500, 2900, 3200, 3300, 2200, 1200),  # yellow rapeseed / sunflower heads
    "soil_light": (1400, 1700, 2000, 2300, 2500, 2600, 2700, 2800, 3400, 2900),
    "soil_dark": (800, 1000, 1200, 1450, 1650, 1750, 1850, 1950, 2600, 2200),
    "urban": (1500, 1600, 1700, 1800, 1900, 1950, 2000, 2050, 2300, 2100),
    "water": (500, 600, 400, 350, 300, 280, 250, 230, 120, 80),
    "cloud": (6500, 6400, 6500, 6600, 6700, 6700, 6800, 6800, 5000, 4000),
}.items()}
_HAZE = np.array([1.0, 0.8, 0.6, 0.5, 0.4, 0.35, 0.3, 0.3, 0.1, 0.05], np.float32)  # scattering falls with wavelength


def _d(month: int, day: int = 1, year: int = 2019) -> int:
    """Days since 2018-09-01 of a date."""
    return (dt.date(year, month, day) - START).days


# A class's season, in days since 2018-09-01: green-up ``up`` to ``peak`` greenness (from ``winter``, the cover of a
# crop sown in autumn 2018), senescence ``down`` (the canopy dries), harvest ``cut`` (bare soil or stubble after);
# ``base``: green cover kept all year (grass under trees, meadow), ``autumn``: a perennial's cover in autumn 2018,
# ``mow``: mowing dates, ``flower``: a window of
# yellow flowers, ``leaf_fall``: when a perennial canopy sheds in autumn 2018; ``canopy`` and ``soil`` its spectra.
SEASONS: Dict[int, Dict[str, Any]] = {
    1: dict(base=0.45, autumn=0.75, up=_d(3, 1), peak=0.85, mow=(_d(5, 20), _d(7, 10), _d(9, 10)), canopy="grass",
            soil=0.3),  # meadow: green all year, mown
    2: dict(winter=0.25, up=_d(3, 1), peak=0.85, down=_d(6, 10), cut=_d(7, 15), canopy="cereal"),  # soft wheat
    3: dict(up=_d(5, 25), peak=0.9, down=_d(9, 5), cut=_d(10, 15), canopy="cereal", ru=12.0),  # corn
    4: dict(winter=0.3, up=_d(2, 15), peak=0.8, down=_d(5, 25), cut=_d(7, 1), canopy="cereal"),  # winter barley
    5: dict(winter=0.5, sown=_d(9, 20, 2018), up=_d(2, 10), peak=0.85, down=_d(5, 25), cut=_d(7, 1), canopy="broadleaf",
            flower=(_d(4, 1), _d(5, 1), 0.55)),  # winter rapeseed: green since its August sowing, yellow in April
    6: dict(up=_d(3, 25), peak=0.8, down=_d(6, 15), cut=_d(7, 20), canopy="cereal"),  # spring barley
    7: dict(up=_d(4, 25), peak=0.75, down=_d(8, 1), cut=_d(9, 10), canopy="broadleaf",
            flower=(_d(7, 1), _d(7, 25), 0.45)),  # sunflower
    8: dict(up=_d(5, 1), peak=0.4, down=_d(10, 1), cut=_d(11, 15), canopy="broadleaf", soil=0.9,
            leaf_fall=_d(10, 25), stubble=0.0),  # grapevine: rows over bright bare soil
    9: dict(up=_d(4, 10), peak=0.9, cut=_d(10, 20), canopy="broadleaf", ru=12.0),  # beet: green until lifted
    10: dict(winter=0.25, up=_d(3, 5), peak=0.9, down=_d(6, 20), cut=_d(7, 25), canopy="cereal"),  # triticale
    11: dict(winter=0.2, up=_d(2, 20), peak=0.75, down=_d(6, 1), cut=_d(7, 5), canopy="cereal", soil=0.75),  # durum
    12: dict(up=_d(4, 15), peak=0.6, down=_d(6, 10), cut=_d(6, 25), canopy="broadleaf", second=True),  # vegetables
    13: dict(up=_d(5, 5), peak=0.85, down=_d(7, 20), cut=_d(8, 25), canopy="broadleaf"),  # potatoes
    14: dict(base=0.3, autumn=0.65, up=_d(3, 15), peak=0.9, canopy="broadleaf",
             mow=(_d(5, 15), _d(6, 20), _d(7, 25), _d(8, 30))),  # leguminous fodder (alfalfa)
    15: dict(up=_d(5, 30), peak=0.85, down=_d(8, 25), cut=_d(9, 30), canopy="broadleaf"),  # soybeans
    16: dict(base=0.35, up=_d(4, 1), peak=0.7, down=_d(10, 15), cut=_d(11, 15), canopy="tree", leaf_fall=_d(10, 30),
             stubble=0.0),  # orchard: trees over grass
    17: dict(winter=0.25, up=_d(3, 10), peak=0.8, down=_d(6, 25), cut=_d(7, 30), canopy="cereal"),  # mixed cereal
    18: dict(up=_d(6, 5), peak=0.8, down=_d(9, 15), cut=_d(10, 20), canopy="cereal", ru=12.0),  # sorghum
}
BACKGROUND: Dict[str, Dict[str, Any]] = {
    "forest": dict(base=0.4, up=_d(4, 20), peak=0.9, down=_d(10, 20), cut=_d(11, 20), canopy="tree",
                   leaf_fall=_d(10, 25), soil=0.1, stubble=0.0),
    "grassland": dict(base=0.5, autumn=0.6, up=_d(3, 10), peak=0.75, down=_d(7, 15), cut=_d(9, 15), canopy="grass",
                      stubble=0.0, regrow=0.55),
    "built-up": dict(urban=0.75, base=0.12, canopy="grass"),
    "water": dict(water=0.95),
}
BACKGROUND_P = {"forest": 0.4, "grassland": 0.3, "built-up": 0.2, "water": 0.1}
_NEVER = 10_000.0  # a date past the series: the term never switches on


def _sig(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


@dataclass(frozen=True)
class Tile:
    """One Sentinel-2 tile of the stand-in: its name, acquisition dates (shared by its patches), the cloud cover of
    each date, and its climate (a shift of every season, days) and soils (a brightness offset)."""

    name: str
    dates: Tuple[dt.date, ...]
    cover: np.ndarray  # (T,) fraction of the tile under cloud on each date
    shift: float
    soil: float

    @property
    def days(self) -> np.ndarray:
        """(T,) float days since 2018-09-01."""
        return np.array([(d - START).days for d in self.dates], np.float64)


def tile_frames(j: int, frames: Tuple[int, int]) -> int:
    """The number of dates of tile j: ``frames`` spread evenly over the four tiles (38, 46, 53, 61 by default)."""
    lo, hi = frames
    return int(round(lo + (hi - lo) * j / (len(TILES) - 1)))


def make_tile(seed: int, j: int, frames: Tuple[int, int] = (38, 61), cloudy: float = 0.3) -> Tile:
    """Tile j: its dates (a random subset of the 5-day grid of 2018-09-01 … 2019-11-30, offset by its orbit), the
    cloud cover of each (Beta-distributed with mean ``cloudy``: mostly clear or mostly overcast scenes), its climate
    and soils."""
    rng = np.random.default_rng([seed, 10 ** 6 + j])
    grid = np.arange(int(rng.integers(0, REVISIT)), (END - START).days + 1, REVISIT)
    n = min(tile_frames(j, frames), grid.size)
    days = np.sort(rng.choice(grid, size=n, replace=False))
    if cloudy <= 0 or cloudy >= 1:
        cover = np.full(n, float(np.clip(cloudy, 0, 1)))
    else:
        cover = rng.beta(0.5, 0.5 * (1 - cloudy) / cloudy, n)
    return Tile(TILES[j % len(TILES)], tuple(START + dt.timedelta(days=int(d)) for d in days), cover,
                float(rng.normal(0, 5)), float(rng.uniform(-0.15, 0.15)))


def _parcel_season(kind: Dict[str, Any], rng: np.random.Generator, shift: float) -> Dict[str, Any]:
    """One parcel's season: the class's, shifted by its tile and its sowing, with its own peak greenness, soil, cover
    crops (before a spring / summer crop, after any harvest) and, for vegetables, a second crop's dates."""
    p = dict(base=0.0, winter=0.0, sown=_d(11, 10, 2018), autumn=0.0, up=_NEVER, ru=8.0, peak=0.0, down=_NEVER,
             cut=_NEVER, mow=(), flower=None, leaf_fall=None, soil=0.5, stubble=0.25, urban=0.0, water=0.0,
             canopy="grass", regrow=0.0)
    p.update(kind)
    s = shift + rng.normal(0, 7)
    for k in ("sown", "up", "down", "cut"):
        p[k] = p[k] + s if p[k] < _NEVER else _NEVER
    p["mow"] = tuple(m + s + rng.normal(0, 6) for m in p["mow"])
    if p["flower"] is not None:
        f0, f1, amount = p["flower"]
        p["flower"] = (f0 + s, f1 + s, amount * rng.uniform(0.8, 1.1))
    if p.pop("second", False):  # vegetables: a second short crop in summer
        p["up2"] = p["cut"] + rng.uniform(15, 40)
        p["cut2"] = p["up2"] + rng.uniform(60, 90)
    p["peak"] *= rng.uniform(0.85, 1.05)
    p["soil"] = float(np.clip(p["soil"] + rng.uniform(-0.25, 0.25), 0, 1))
    arable = kind.get("urban", 0) == 0 and kind.get("water", 0) == 0 and kind.get("base", 0) == 0
    p["cover_before"] = 0.3 * rng.uniform(0.6, 1.0) if arable and p["winter"] == 0 and rng.random() < 0.35 else 0.0
    p["cover_after"] = 0.3 * rng.uniform(0.6, 1.0) if arable and rng.random() < 0.35 else 0.0
    return p


def _fractions(t: np.ndarray, p: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """Endmember fractions (T,) of one parcel at days ``t``: green canopy, dry canopy, flowers, built-up, water and
    bare soil (the rest)."""
    up = _sig((t - p["up"]) / p["ru"])
    down = _sig((t - p["down"]) / 8.0)
    cut = _sig((t - p["cut"]) / 3.0)
    season = p["winter"] * _sig((t - p["sown"]) / 10.0) + (p["peak"] - p["winter"]) * up
    green = season * (1 - down) * (1 - cut)
    if "up2" in p:
        green = green + p["peak"] * _sig((t - p["up2"]) / 6.0) * (1 - _sig((t - p["cut2"]) / 4.0))
    if p["leaf_fall"] is not None:  # a perennial canopy, in leaf until autumn 2018
        green = green + p["peak"] * (1 - _sig((t - (p["leaf_fall"] - 365)) / 8.0))
    green = green + p["regrow"] * _sig((t - p["cut"] - 20) / 8.0)
    green = np.maximum(green, p["autumn"] * (1 - _sig((t - _d(11, 20, 2018)) / 12.0)))  # perennial cover, 2018
    for m in p["mow"]:
        green = green * (1 - 0.6 * np.exp(-np.maximum(t - m, 0) / 18.0) * (t > m))
    cover = p["cover_before"] * (1 - _sig((t - 150.0) / 10.0)) + p["cover_after"] * _sig((t - p["cut"] - 30) / 8.0)
    green = np.clip(np.maximum(green, p["base"]) + cover * (1 - green), 0, 1)
    dry = 0.7 * down * (1 - cut) * p["peak"] + p["stubble"] * cut * np.exp(-np.maximum(t - p["cut"], 0) / 40.0)
    flower = np.zeros_like(t)
    if p["flower"] is not None:
        f0, f1, amount = p["flower"]
        flower = amount * _sig((t - f0) / 4.0) * (1 - _sig((t - f1) / 4.0))
    parts = {"green": green * (1 - 0.5 * flower), "dry": np.clip(dry, 0, 1) * (1 - green), "flower": flower,
             "urban": np.full_like(t, p["urban"]), "water": np.full_like(t, p["water"])}
    total = sum(parts.values())
    scale = np.where(total > 1, 1 / np.maximum(total, 1e-9), 1.0)
    parts = {k: v * scale for k, v in parts.items()}
    parts["soil"] = np.clip(1 - sum(parts.values()), 0, 1)
    return parts


def _spectra(t: np.ndarray, p: Dict[str, Any], soil_offset: float) -> np.ndarray:
    """(T, 10) reflectance of one parcel: its fractions mixed with its canopy's and soil's spectra."""
    f = _fractions(t, p)
    light = float(np.clip(p["soil"] + soil_offset, 0, 1))
    soil = light * ENDMEMBERS["soil_light"] + (1 - light) * ENDMEMBERS["soil_dark"]
    spec = {"green": ENDMEMBERS[p["canopy"]], "dry": ENDMEMBERS["dry"], "flower": ENDMEMBERS["flower"],
            "urban": ENDMEMBERS["urban"], "water": ENDMEMBERS["water"], "soil": soil}
    return sum(f[k][:, None] * spec[k][None] for k in f)


def _voronoi(rng: np.random.Generator, size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Voronoi cells of ≈ CELL_AREA pixels on a canvas of twice ``size``, the patch at its centre: the (size, size)
    cell of each patch pixel, and each cell's share of its area inside the patch (for the void rule)."""
    canvas = 2 * size
    n = max(2, int(rng.poisson(canvas * canvas / CELL_AREA)))
    seeds = rng.uniform(0, canvas, (n, 2))
    stretch = rng.uniform(0.5, 1.0)  # fields elongated along one direction per patch
    yy, xx = np.mgrid[0:canvas, 0:canvas].astype(np.float32)
    d = (yy[None] - seeds[:, 0, None, None]) ** 2 + stretch * (xx[None] - seeds[:, 1, None, None]) ** 2
    cells = d.argmin(0)
    lo = size // 2
    inside = cells[lo:lo + size, lo:lo + size]
    share = np.bincount(inside.ravel(), minlength=n) / np.maximum(np.bincount(cells.ravel(), minlength=n), 1)
    return inside, share


def _clouds(rng: np.random.Generator, refl: np.ndarray, cover: np.ndarray) -> None:
    """Clouds in place on (T, C, S, S): on date k a pixel is under cloud where a smooth random field (one draw per
    patch and date) falls below the tile's cover ``cover[k]``, so that a share ``cover[k]`` of the tile is; soft edges
    and a shadow beside the cloud."""
    from scipy import ndimage
    from scipy.special import ndtr

    T, _, S, _ = refl.shape
    for k in np.flatnonzero(cover > 0):
        coarse = rng.standard_normal((3, 3))
        local = ndimage.zoom(coarse, S / 3, order=1, mode="nearest")[:S, :S]
        u = ndtr(0.8 * rng.standard_normal() + 0.6 * local)  # roughly uniform on [0, 1] across the tile
        alpha = np.clip((cover[k] - u) / 0.08, 0, 1).astype(np.float32) * rng.uniform(0.75, 1.0)
        if not alpha.any():
            continue
        dy, dx = rng.integers(2, 6, 2) * rng.choice([-1, 1], 2)
        shadow = np.roll(alpha, (int(dy), int(dx)), axis=(0, 1)) * (1 - alpha)
        refl[k] *= (1 - 0.5 * shadow)[None]
        cloud = ENDMEMBERS["cloud"][:, None, None] * rng.uniform(0.8, 1.05)
        refl[k] = refl[k] * (1 - alpha)[None] + cloud * alpha[None]


def make_patch(rng: np.random.Generator, tile: Tile, size: int = 24) -> Dict[str, Any]:
    """One patch of ``tile``: int16 reflectances (T, 10, size, size) on the tile's dates, uint8 classes
    (size, size), parcel ids (int32, 1-based) and its number of labelled crop parcels."""
    from scipy import ndimage

    cells, share = _voronoi(rng, size)
    n = share.size
    crop_p = np.asarray(PARCEL_COUNTS, np.float64) / sum(PARCEL_COUNTS)
    labels = np.zeros(n, np.uint8)
    t = tile.days
    spectra = np.zeros((n, t.size, 10), np.float32)
    for j in np.unique(cells):
        if rng.random() < BACKGROUND_SHARE:
            kind = BACKGROUND[rng.choice(list(BACKGROUND_P), p=list(BACKGROUND_P.values()))]
        else:
            labels[j] = int(rng.choice(len(PARCEL_COUNTS), p=crop_p)) + 1
            kind = SEASONS[int(labels[j])]
        spectra[j] = _spectra(t, _parcel_season(kind, rng, tile.shift), tile.soil)
    refl = spectra[cells].transpose(2, 3, 0, 1)  # (T, 10, S, S)
    field = ndimage.gaussian_filter(rng.standard_normal((size, size)), 1.5, mode="wrap")
    refl = refl * (1 + 0.04 * field / (field.std() + 1e-9)).astype(np.float32)[None, None]  # within-field variation
    refl = ndimage.gaussian_filter(refl, (0, 0, 0.5, 0.5), mode="nearest")  # the sensor's point spread
    haze = rng.uniform(0, 250, (t.size, 1, 1, 1)).astype(np.float32) * _HAZE[None, :, None, None]
    refl = refl * rng.uniform(0.95, 1.05, (t.size, 1, 1, 1)).astype(np.float32) + haze
    _clouds(rng, refl, tile.cover)
    refl *= 1 + 0.015 * rng.standard_normal(refl.shape, dtype=np.float32)  # sensor noise
    refl += 30 * rng.standard_normal(refl.shape, dtype=np.float32)
    void = (labels > 0) & (share < 0.5)  # a crop parcel mostly outside its patch: PASTIS's void label
    classes = np.where(void, VOID, labels)[cells].astype(np.uint8)
    crops = np.unique(cells[(classes > 0) & (classes < NUM_CLASSES)])
    return {"s2": np.clip(np.rint(refl), 0, 32767).astype(np.int16), "classes": classes,
            "parcels": (cells + 1).astype(np.int32), "n_parcel": int(crops.size)}


def _feature(pid: int, fold: int, tile: Tile, k: int, size: int, p: Dict[str, Any]) -> Dict[str, Any]:
    """A patch's GeoJSON feature in PASTIS's metadata layout (a square in Lambert-93 per tile row)."""
    classes = p["classes"]
    x0, y0 = 600_000 + 10 * size * (k % 50), 6_500_000 + 10 * size * (k // 50)
    side = 10 * size
    return {"type": "Feature",
            "properties": {"ID_PATCH": pid, "Fold": fold, "TILE": tile.name, "N_Parcel": p["n_parcel"],
                           "Patch_Cover": round(float(np.mean((classes > 0) & (classes < NUM_CLASSES))), 4),
                           "dates-S2": {str(i): int(d.strftime("%Y%m%d")) for i, d in enumerate(tile.dates)}},
            "geometry": {"type": "Polygon", "coordinates": [[[x0, y0], [x0 + side, y0], [x0 + side, y0 + side],
                                                             [x0, y0 + side], [x0, y0]]]}}


def write_synthetic_pastis(root: Union[str, Path], patches_per_fold: int = 120, size: int = 24,
                           frames: Tuple[int, int] = (38, 61), cloudy: float = 0.3, seed: int = 0,
                           progress: bool = True) -> Path:
    """Write ``5 × patches_per_fold`` patches of ``size`` × ``size`` pixels in the PASTIS layout into ``root`` (which
    must not exist); the four tiles have ``frames[0]`` … ``frames[1]`` dates. The default (600 patches, 360 of them
    in a fold's training split, 38–61 dates) is ≈ 340 MB."""
    root = Path(root)
    if patches_per_fold < 1 or size < 8 or not 1 <= frames[0] <= frames[1] or not 0 <= cloudy <= 1:
        raise ValueError(f"need patches_per_fold ≥ 1, size ≥ 8, 1 ≤ frames[0] ≤ frames[1], 0 ≤ cloudy ≤ 1; got "
                         f"{patches_per_fold}, {size}, {frames}, {cloudy}")
    tiles = [make_tile(seed, j, tuple(frames), cloudy) for j in range(len(TILES))]
    with build_folder(root) as tmp:
        (tmp / "DATA_S2").mkdir()
        (tmp / "ANNOTATIONS").mkdir()
        sums, squares, counts = np.zeros((FOLDS, 10)), np.zeros((FOLDS, 10)), np.zeros(FOLDS)
        features = []
        from tqdm.auto import tqdm

        for k in tqdm(range(FOLDS * patches_per_fold), desc="synthetic PASTIS", unit="patch", disable=not progress):
            pid, fold, tile = 10000 + k, 1 + k % FOLDS, tiles[(k // FOLDS) % len(TILES)]
            p = make_patch(np.random.default_rng([seed, k]), tile, size)
            np.save(tmp / "DATA_S2" / f"S2_{pid}.npy", p["s2"])
            np.save(tmp / "ANNOTATIONS" / f"TARGET_{pid}.npy", p["classes"][None])
            np.save(tmp / "ANNOTATIONS" / f"ParcelIDs_{pid}.npy", p["parcels"])
            x = p["s2"].astype(np.float64)
            sums[fold - 1] += x.sum((0, 2, 3))
            squares[fold - 1] += np.square(x).sum((0, 2, 3))
            counts[fold - 1] += x.shape[0] * x.shape[2] * x.shape[3]
            features.append(_feature(pid, fold, tile, k, size, p))
        meta = {"type": "FeatureCollection", "name": "metadata",
                "crs": {"type": "name", "properties": {"name": "urn:ogc:def:crs:EPSG::2154"}}, "features": features}
        (tmp / "metadata.geojson").write_text(json.dumps(meta))
        mean = sums / counts[:, None]
        std = np.sqrt(np.maximum(squares / counts[:, None] - mean ** 2, 1e-12))
        norm = {f"Fold_{f + 1}": {"mean": mean[f].tolist(), "std": std[f].tolist()} for f in range(FOLDS)}
        (tmp / "NORM_S2_patch.json").write_text(json.dumps(norm, indent=1))
    return root


def default_data(name: str = "synthetic", seed: int = 0, progress: bool = True, **sizes: Any) -> Path:
    """The folder of the offline default (generated on first use into the cache, then reused): the PASTIS stand-in
    of :func:`write_synthetic_pastis`; ``sizes`` are its keyword arguments (each combination is its own folder)."""
    if name not in DEFAULTS:
        raise ValueError(f"unknown default dataset {name!r}; expected one of {', '.join(DEFAULTS)} or a folder")
    return cached_default("eo", name, VERSION, write_synthetic_pastis, seed=seed, progress=progress, **sizes)


def resolve_data(data: Optional[str], seed: int = 0, progress: bool = True) -> Path:
    """``None`` or ``synthetic`` → the offline default's folder; anything else is a PASTIS folder (it must exist
    and hold metadata.geojson)."""
    root = resolve_folder(data, DEFAULTS, lambda name: default_data(name, seed=seed, progress=progress))
    metadata_path(root)
    return root
