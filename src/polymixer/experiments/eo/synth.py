"""An offline, seeded Sentinel-2 time-series dataset of field parcels, written in exactly the PASTIS layout.

What makes the task temporal rather than a colour lookup:

* **Parcels** — each patch is cut into Voronoi cells (30–70 per 128 × 128 patch, ≈ 50 as in PASTIS), each cell one
  field of one class: background (non-agricultural: forest, grassland, built-up, water; ≈ 30% of the cells) or one
  of the 18 PASTIS crop types with PASTIS-like skewed frequencies (meadow ≈ 1 crop parcel in 4, sorghum 1 in 100);
  a few cells are out-of-scope crops (void label); pixels on a parcel border are void, and a sub-pixel blur mixes
  the neighbouring fields' reflectances there.
* **Phenology** — every class has a characteristic vegetation curve over the year: the fractions of green
  vegetation, dry vegetation (ripening crop, straw, stubble), flowers (rapeseed, sunflower), bare soil and, for
  background, built-up surfaces and water, as double-logistic green-up / senescence / harvest curves. Winter crops
  are green in winter and harvested in summer, summer crops bare until May and harvested in autumn, meadows and
  fodder are mown several times, vines and orchards leaf out over a soil-dominated floor. The winter cereals (soft
  wheat, durum wheat, barley, triticale, mixed cereal) and the summer crops (corn, sorghum, soybeans) share the same
  endmember spectra and curve shapes and differ **only in their timing** — green-up, senescence and harvest days to
  a few weeks apart, sometimes less than the spread between fields — so no single date and no yearly average
  separates them.
* **Jitter** — timing shifted per patch (±4 days, a regional climate), per parcel (±5 days, sowing date; mowing
  dates ±12 days) and per pixel (σ 1.5 days); peak greenness, curve steepness and soil brightness per parcel;
  greenness heterogeneity inside a field as a smooth random field; sensor noise per pixel, band and date.
* **Acquisitions** — 20–32 dates per patch on the 5-day revisit grid of 2019 (a per-patch orbit offset), so
  patches rarely share their dates; each date has a global illumination factor and blue haze; 30% of the dates are
  cloudy (smooth cloud fields covering 10–100% of the patch, with soft edges and shadows cast 80–200 m away).

Fractions are mixed linearly with 10-band endmember spectra (Sentinel-2 B2, B3, B4, B5, B6, B7, B8, B8A, B11, B12,
reflectance × 10⁴) and stored as int16, like PASTIS. Files::

    metadata.geojson  (ID_PATCH, Fold, dates-S2, N_Parcel, Patch_Cover, TILE; square Lambert-93 geometries)
    DATA_S2/S2_<ID>.npy  ANNOTATIONS/TARGET_<ID>.npy (1, H, W)  ANNOTATIONS/ParcelIDs_<ID>.npy  NORM_S2_patch.json

Patch k draws its randomness from ``numpy.random.default_rng([seed, k])``; its fold is ``1 + k % 5``. The dataset is
written into a temporary sibling folder renamed to ``root`` at the end: an interrupted run never leaves half a
dataset.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ..data.cache import build_folder, cached_default, resolve_folder
from .data import DEFAULTS, FOLDS, NUM_CLASSES, VOID, metadata_path

__all__ = ["VERSION", "write_synthetic_pastis", "make_patch", "CLASS_CURVES", "ENDMEMBERS", "default_data",
           "resolve_data"]

VERSION = 1
YEAR = 2019

# endmember reflectances × 10⁴ for B2, B3, B4, B5, B6, B7, B8, B8A, B11, B12
ENDMEMBERS: Dict[str, np.ndarray] = {k: np.array(v, np.float32) for k, v in {
    "green": (250, 550, 300, 900, 2600, 3300, 3700, 3900, 1900, 900),
    "dry": (900, 1150, 1400, 1700, 2000, 2200, 2300, 2400, 3300, 2700),
    "flower": (500, 1300, 1100, 1600, 2500, 2900, 3200, 3300, 2200, 1200),
    "soil_light": (1400, 1700, 2000, 2300, 2500, 2600, 2700, 2800, 3400, 2900),
    "soil_dark": (800, 1000, 1200, 1450, 1650, 1750, 1850, 1950, 2600, 2200),
    "urban": (1500, 1600, 1700, 1800, 1900, 1950, 2000, 2050, 2300, 2100),
    "water": (500, 600, 400, 350, 300, 280, 250, 230, 120, 80),
    "cloud": (6500, 6400, 6500, 6600, 6700, 6700, 6800, 6800, 5000, 4000),
}.items()}
_HAZE = np.array([1.0, 0.8, 0.6, 0.5, 0.4, 0.35, 0.3, 0.3, 0.1, 0.05], np.float32)  # scattering falls with wavelength

_OFF = 999.0  # a date beyond the year: the term never switches on

# The curve parameters (days of year, 0-based): winter green level w, green-up u (rate ru), peak greenness, the
# level perennial covers keep after senescence (floor), a
# second cycle (u2, s2, peak2), senescence s (rate rs), harvest h, dry-crop level, stubble left after harvest,
# flowering window (f0, f1, amount), autumn emergence of the next winter crop, up to four mowing dates, and the
# built-up / water fractions of background covers. Missing keys take the defaults below.
_DEFAULTS = dict(w=0.0, floor=0.0, u=_OFF, ru=10.0, peak=0.85, u2=_OFF, s2=_OFF, peak2=0.0, s=_OFF, rs=8.0, h=_OFF,
                 dry=0.6, stubble=0.3, f0=_OFF, f1=_OFF, flower=0.0, autumn=0.0, cuts=(), cut_depth=0.55, urban=0.0,
                 water=0.0, soil_light=0.5)
_WINTER = dict(w=0.3, ru=12.0, autumn=0.25)
CLASS_CURVES: Dict[int, Dict[str, object]] = {
    1: dict(w=0.45, floor=0.45, u=80, ru=15, peak=0.8, cuts=(145, 215), s=300, rs=20, dry=0.0),  # meadow
    2: dict(_WINTER, u=72, peak=0.88, s=167, h=196),  # soft winter wheat
    3: dict(u=155, peak=0.9, s=245, h=285),  # corn
    4: dict(_WINTER, u=65, peak=0.85, s=150, h=178),  # winter barley
    5: dict(w=0.45, u=60, ru=12, peak=0.85, f0=95, f1=125, flower=0.55, s=160, h=185, autumn=0.35),  # rapeseed
    6: dict(u=100, peak=0.82, s=168, h=200),  # spring barley
    7: dict(u=135, peak=0.75, f0=185, f1=205, flower=0.45, s=220, h=255, dry=0.7),  # sunflower
    8: dict(w=0.05, floor=0.05, u=115, peak=0.4, s=285, rs=10, dry=0.1, stubble=0.0, soil_light=0.9),  # grapevine
    9: dict(u=130, peak=0.85, h=285, dry=0.0, stubble=0.1),  # beet: green until lifted
    10: dict(_WINTER, u=72, peak=0.9, s=172, h=200),  # winter triticale
    11: dict(_WINTER, u=70, peak=0.84, s=160, h=188),  # winter durum wheat
    12: dict(u=105, peak=0.6, s=150, h=160, u2=200, s2=245, peak2=0.6, dry=0.2, stubble=0.0),  # fruits, vegetables
    13: dict(u=125, peak=0.8, s=205, rs=6, h=225, dry=0.5),  # potatoes
    14: dict(w=0.3, floor=0.3, u=75, peak=0.85, cuts=(120, 165, 210, 255), cut_depth=0.6, s=300, rs=20,
             dry=0.0),  # leguminous fodder
    15: dict(u=150, peak=0.8, s=238, h=268),  # soybeans
    16: dict(w=0.2, floor=0.2, u=100, peak=0.65, s=300, rs=12, dry=0.1, stubble=0.0, soil_light=0.2),  # orchard
    17: dict(_WINTER, w=0.25, u=75, peak=0.8, s=165, h=195),  # mixed cereal
    18: dict(u=165, peak=0.8, s=255, h=290),  # sorghum
}
_BACKGROUND: Dict[str, Dict[str, object]] = {
    "forest": dict(w=0.45, floor=0.45, u=110, peak=0.85, s=300, rs=12, dry=0.2, stubble=0.0, soil_light=0.0),
    "grassland": dict(w=0.4, floor=0.35, u=85, ru=15, peak=0.7, s=230, rs=25, dry=0.3, stubble=0.0),
    "built-up": dict(w=0.1, peak=0.1, urban=0.8),
    "water": dict(water=0.95),
}
_BACKGROUND_P = {"forest": 0.4, "grassland": 0.3, "built-up": 0.2, "water": 0.1}
# relative parcel frequencies of the 18 crop types (PASTIS-like: meadow and wheat dominate, sorghum is rare)
_CROP_FREQ = np.array([0.26, 0.14, 0.12, 0.06, 0.04, 0.025, 0.035, 0.06, 0.015, 0.035, 0.03, 0.03, 0.012, 0.04,
                       0.02, 0.02, 0.015, 0.01])
_CROP_FREQ = _CROP_FREQ / _CROP_FREQ.sum()
_DATE_KEYS = ("u", "s", "h", "f0", "f1", "u2", "s2")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _smooth_field(rng: np.random.Generator, size: int, sigma: float) -> np.ndarray:
    """A smooth random field of zero mean and unit standard deviation."""
    from scipy import ndimage

    f = ndimage.gaussian_filter(rng.standard_normal((size, size)), sigma, mode="wrap")
    return (f - f.mean()) / (f.std() + 1e-9)


def _voronoi(rng: np.random.Generator, size: int, n: int) -> np.ndarray:
    """(size, size) parcel index of each pixel: the nearest of n random seeds, with a mildly anisotropic metric
    (fields elongated in one direction per patch)."""
    seeds = rng.uniform(0, size, (n, 2))
    stretch = rng.uniform(0.6, 1.0)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    d = (yy[None] - seeds[:, 0, None, None]) ** 2 + stretch * (xx[None] - seeds[:, 1, None, None]) ** 2
    return d.argmin(0)


def _curve_params(cls_curve: Dict[str, object], rng: np.random.Generator, shift: float) -> Dict[str, object]:
    """A parcel's curve: the class's, with dates shifted by ``shift`` (and mowing dates jittered on their own),
    peak greenness, steepness and soil brightness jittered."""
    p = {**_DEFAULTS, **cls_curve}
    for k in _DATE_KEYS:
        if p[k] < _OFF:
            p[k] = float(p[k]) + shift
    p["cuts"] = tuple(float(c) + shift + rng.uniform(-12, 12) for c in p["cuts"])  # type: ignore[union-attr]
    p["peak"] = float(p["peak"]) * rng.uniform(0.88, 1.05)
    p["peak2"] = float(p["peak2"]) * rng.uniform(0.8, 1.1)
    p["ru"] = float(p["ru"]) * rng.uniform(0.8, 1.25)
    p["rs"] = float(p["rs"]) * rng.uniform(0.8, 1.25)
    p["soil_light"] = float(np.clip(float(p["soil_light"]) + rng.uniform(-0.3, 0.3), 0, 1))  # type: ignore[arg-type]
    p["soil_gain"] = rng.uniform(0.85, 1.15)
    return p


def _fractions(t: np.ndarray, P: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Endmember fractions (T, S, S) from per-pixel parameter maps (S, S) at days ``t`` (T,)."""
    t = t[:, None, None]
    jit = P["jitter"][None]
    sig = lambda k, r: _sigmoid((t - (P[k][None] + jit)) / r)  # noqa: E731
    su, ss, sh = sig("u", P["ru"][None]), sig("s", P["rs"][None]), sig("h", 3.0)
    season = P["w"][None] + (P["peak"][None] * P["gain"][None] - P["w"][None]) * su
    green = (season * (1 - ss) + P["floor"][None] * ss) * (1 - sh)
    green = green + P["peak2"][None] * sig("u2", 8.0) * (1 - sig("s2", 6.0))
    green = green + P["autumn"][None] * _sigmoid((t - 305.0) / 10.0) * sh
    for c in range(P["cuts"].shape[0]):
        after = np.maximum(t - (P["cuts"][c][None] + jit), 0.0)
        cut = (after > 0) & (P["cuts"][c][None] < _OFF)
        green = green * (1 - P["cut_depth"][None] * np.exp(-after / 18.0) * cut)
    flower = P["flower"][None] * sig("f0", 4.0) * (1 - sig("f1", 4.0))
    green = green - 0.5 * flower
    dry = P["dry"][None] * ss * (1 - sh) + P["stubble"][None] * sh * (1 - _sigmoid((t - (P["h"][None] + 30)) / 5.0))
    urban = np.broadcast_to(P["urban"][None], green.shape)
    water = np.broadcast_to(P["water"][None], green.shape)
    parts = {"green": np.clip(green, 0, 1), "dry": np.clip(dry, 0, 1), "flower": np.clip(flower, 0, 1),
             "urban": urban, "water": water}
    total = sum(parts.values())
    scale = np.where(total > 1, 1 / np.maximum(total, 1e-9), 1.0)
    parts = {k: v * scale for k, v in parts.items()}
    parts["soil"] = np.clip(1 - sum(parts.values()), 0, 1)
    return parts


def _dates(rng: np.random.Generator, frames: Tuple[int, int]) -> List[dt.date]:
    """Sorted acquisition dates: a random subset of the 5-day revisit grid of one year, a per-patch orbit offset."""
    offset = int(rng.integers(0, 5))
    grid = np.arange(offset, 365, 5)
    n = int(rng.integers(frames[0], frames[1] + 1))
    days = np.sort(rng.choice(grid, size=min(n, grid.size), replace=False))
    return [dt.date(YEAR, 1, 1) + dt.timedelta(days=int(d)) for d in days]


def _clouds(rng: np.random.Generator, refl: np.ndarray, cloudy: float) -> None:
    """Clouds with soft edges and their shadows on a share ``cloudy`` of the frames, in place on (T, C, S, S)."""
    T, _, S, _ = refl.shape
    for k in range(T):
        if rng.random() >= cloudy:
            continue
        field = _smooth_field(rng, S, rng.uniform(6, 14))
        cover = rng.uniform(0.1, 1.0)
        thr = np.quantile(field, 1 - cover)
        alpha = np.clip((field - thr) / 0.6, 0, 1) * rng.uniform(0.7, 1.0)  # (S, S) opacity
        dy, dx = rng.integers(8, 20, 2) * rng.choice([-1, 1], 2)
        shadow = np.roll(alpha, (int(dy), int(dx)), axis=(0, 1)) * (1 - alpha)
        refl[k] *= (1 - 0.6 * shadow)[None]
        refl[k] = refl[k] * (1 - alpha)[None] + ENDMEMBERS["cloud"][:, None, None] * alpha[None]


def make_patch(rng: np.random.Generator, size: int = 128, frames: Tuple[int, int] = (20, 32),
               cloudy: float = 0.3) -> Dict[str, object]:
    """One synthetic patch: int16 reflectances (T, 10, size, size), uint8 classes (size, size), parcel ids, dates
    and parcel count."""
    from scipy import ndimage

    n = int(rng.integers(30, 71) * (size / 128) ** 2) + 2
    parcels = _voronoi(rng, size, n)
    kinds = rng.random(n)
    labels = np.zeros(n, np.uint8)
    curves: List[Dict[str, object]] = []
    shift = rng.uniform(-4, 4)  # the patch's climate
    for j in range(n):
        if kinds[j] < 0.3:
            bg = rng.choice(list(_BACKGROUND_P), p=list(_BACKGROUND_P.values()))
            labels[j], curve = 0, _BACKGROUND[bg]
        else:
            crop = int(rng.choice(18, p=_CROP_FREQ)) + 1
            labels[j] = VOID if kinds[j] > 0.97 else crop  # an out-of-scope crop: its spectra, the void label
            curve = CLASS_CURVES[crop]
        curves.append(_curve_params(curve, rng, shift + rng.uniform(-5, 5)))
    keys = ("w", "floor", "u", "ru", "peak", "u2", "s2", "peak2", "s", "rs", "h", "dry", "stubble", "f0", "f1",
            "flower", "autumn", "cut_depth", "urban", "water", "soil_light", "soil_gain")
    P = {k: np.array([float(c[k]) for c in curves], np.float32)[parcels] for k in keys}  # type: ignore[arg-type]
    cuts = np.full((n, 4), _OFF, np.float32)
    for j, c in enumerate(curves):
        cuts[j, :len(c["cuts"])] = c["cuts"]  # type: ignore[arg-type]
    P["cuts"] = cuts[parcels].transpose(2, 0, 1)
    P["jitter"] = rng.normal(0, 1.5, (size, size)).astype(np.float32)
    P["gain"] = (1 + 0.08 * _smooth_field(rng, size, 3.0)).astype(np.float32)

    dates = _dates(rng, frames)
    t = np.array([(d - dt.date(YEAR, 1, 1)).days for d in dates], np.float32)
    f = _fractions(t, P)
    soil = (P["soil_light"][None] * ENDMEMBERS["soil_light"][:, None, None]
            + (1 - P["soil_light"][None]) * ENDMEMBERS["soil_dark"][:, None, None]) * P["soil_gain"][None]
    refl = f["soil"][:, None] * soil[None]  # (T, 10, S, S)
    for name in ("green", "dry", "flower", "urban", "water"):
        refl += f[name][:, None] * ENDMEMBERS[name][None, :, None, None]
    refl = ndimage.gaussian_filter(refl, (0, 0, 0.6, 0.6), mode="nearest")  # the sensor's point spread
    illum = rng.uniform(0.93, 1.07, (len(dates), 1, 1, 1)).astype(np.float32)
    haze = rng.uniform(0, 300, (len(dates), 1, 1, 1)).astype(np.float32) * _HAZE[None, :, None, None]
    refl = refl * illum + haze
    _clouds(rng, refl, cloudy)
    refl *= 1 + rng.normal(0, 0.015, refl.shape).astype(np.float32)
    refl += rng.normal(0, 30, refl.shape).astype(np.float32)

    classes = labels[parcels]
    border = np.zeros((size, size), bool)
    border[:, :-1] |= parcels[:, :-1] != parcels[:, 1:]
    border[:-1, :] |= parcels[:-1, :] != parcels[1:, :]
    classes = np.where(border, VOID, classes).astype(np.uint8)
    crops = {int(j) for j in np.unique(parcels) if 0 < labels[j] < NUM_CLASSES}
    return {"s2": np.clip(np.rint(refl), 0, 32767).astype(np.int16), "classes": classes,
            "parcels": (parcels + 1).astype(np.int32), "dates": dates, "n_parcel": len(crops)}


def write_synthetic_pastis(root: Union[str, Path], patches_per_fold: int = 10, size: int = 128,
                           frames: Tuple[int, int] = (20, 32), cloudy: float = 0.3, seed: int = 0,
                           progress: bool = True) -> Path:
    """Write ``5 × patches_per_fold`` synthetic patches in the PASTIS layout into ``root`` (which must not exist);
    ``frames`` bounds the number of dates per patch. The default (50 patches of 128 × 128, 20–32 dates) is ≈ 430 MB
    and takes about half a minute."""
    root = Path(root)
    if patches_per_fold < 1 or size < 8 or not 1 <= frames[0] <= frames[1] or not 0 <= cloudy <= 1:
        raise ValueError(f"need patches_per_fold ≥ 1, size ≥ 8, 1 ≤ frames[0] ≤ frames[1], 0 ≤ cloudy ≤ 1; got "
                         f"{patches_per_fold}, {size}, {frames}, {cloudy}")
    with build_folder(root) as tmp:
        (tmp / "DATA_S2").mkdir()
        (tmp / "ANNOTATIONS").mkdir()
        total = FOLDS * patches_per_fold
        sums = np.zeros((FOLDS, 10))
        squares = np.zeros((FOLDS, 10))
        counts = np.zeros(FOLDS)
        features = []
        from tqdm.auto import tqdm

        for k in tqdm(range(total), desc="synthetic PASTIS", unit="patch", disable=not progress):
            pid, fold = 10000 + k, 1 + k % FOLDS
            p = make_patch(np.random.default_rng([seed, k]), size, tuple(frames), cloudy)
            s2, classes = p["s2"], p["classes"]
            np.save(tmp / "DATA_S2" / f"S2_{pid}.npy", s2)
            np.save(tmp / "ANNOTATIONS" / f"TARGET_{pid}.npy", classes[None])
            np.save(tmp / "ANNOTATIONS" / f"ParcelIDs_{pid}.npy", p["parcels"])
            x = s2.astype(np.float64)
            sums[fold - 1] += x.sum((0, 2, 3))
            squares[fold - 1] += np.square(x).sum((0, 2, 3))
            counts[fold - 1] += x.shape[0] * x.shape[2] * x.shape[3]
            x0, y0 = 600_000 + 1280 * (k % 25), 6_500_000 + 1280 * (k // 25)
            side = 10 * size
            features.append({
                "type": "Feature",
                "properties": {"ID_PATCH": pid, "Fold": fold, "TILE": "SYNTH",
                               "N_Parcel": p["n_parcel"],
                               "Patch_Cover": round(float(np.mean((classes > 0) & (classes < NUM_CLASSES))), 4),
                               "dates-S2": {str(i): int(d.strftime("%Y%m%d")) for i, d in enumerate(p["dates"])}},
                "geometry": {"type": "Polygon", "coordinates": [[[x0, y0], [x0 + side, y0], [x0 + side, y0 + side],
                                                                 [x0, y0 + side], [x0, y0]]]}})
        meta = {"type": "FeatureCollection", "name": "metadata",
                "crs": {"type": "name", "properties": {"name": "urn:ogc:def:crs:EPSG::2154"}}, "features": features}
        (tmp / "metadata.geojson").write_text(json.dumps(meta))
        mean = sums / counts[:, None]
        std = np.sqrt(np.maximum(squares / counts[:, None] - mean ** 2, 1e-12))
        norm = {f"Fold_{f + 1}": {"mean": mean[f].tolist(), "std": std[f].tolist()} for f in range(FOLDS)}
        (tmp / "NORM_S2_patch.json").write_text(json.dumps(norm, indent=1))
    return root


def default_data(name: str = "synthetic", seed: int = 0, progress: bool = True, **sizes: Any) -> Path:
    """The folder of the offline default (generated on first use into the cache, then reused): synthetic Sentinel-2
    series of field parcels in the PASTIS layout; ``sizes`` are keyword arguments of :func:`write_synthetic_pastis`
    (each combination is its own folder)."""
    if name not in DEFAULTS:
        raise ValueError(f"unknown default dataset {name!r}; expected one of {', '.join(DEFAULTS)} or a folder")
    return cached_default("eo", name, VERSION, write_synthetic_pastis, seed=seed, progress=progress, **sizes)


def resolve_data(data: Optional[str], seed: int = 0, progress: bool = True) -> Path:
    """``None`` or ``synthetic`` → the offline default's folder; anything else is a PASTIS folder (it must exist
    and hold metadata.geojson)."""
    root = resolve_folder(data, DEFAULTS, lambda name: default_data(name, seed=seed, progress=progress))
    metadata_path(root)
    return root
