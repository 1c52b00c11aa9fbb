"""Satellite image time series for crop-type segmentation: the PASTIS layout, its folds, band normalisation,
training windows, batching, and the offline default.

The layout (PASTIS, Sainte Fare Garnot & Landrieu 2021), read as is::

    <root>/metadata.geojson              a FeatureCollection, one feature per patch with the properties
                                         ID_PATCH, Fold (1–5), dates-S2 ({"0": 20180924, …}; a dict or its JSON
                                         string), N_Parcel, Patch_Cover
    <root>/DATA_S2/S2_<ID>.npy           (T, 10, H, W) Sentinel-2 reflectances (int16 in PASTIS; T = number of dates)
    <root>/ANNOTATIONS/TARGET_<ID>.npy   (C, H, W) with channel 0 the class: 0 background, 1–18 crops, 19 void
    <root>/NORM_S2_patch.json            optional: {"Fold_k": {"mean": [10 values], "std": [10 values]}, …}

PASTIS patches are 128 × 128 pixels of 10 m (1.6384 km²), 38–61 dates from September 2018 to November 2019. Folds
are split cyclically: fold f trains on folds f, f+1, f+2, validates on f+3 and tests on f+4 (mod 5; fold 1: train
1–3, val 4, test 5). Frames are sorted by date, and a frame's day of year (0–365) comes from its date. TSViT trains on
the 25 windows of 24 × 24 pixels of each patch (row-major, the last 8 rows and columns dropped); whole patches work
as well.

Bands are normalised per band, ``(x − mean) / std``, with (in order of preference) the statistics of the training
folds from ``NORM_S2_patch.json``, statistics computed from the training split, or TSViT's published PASTIS fold-1
statistics (:data:`TSVIT_PASTIS_STATS`); the statistics used are saved with every checkpoint.

The offline default (no download) is written by :mod:`polymixer.experiments.eo.synth` in exactly this layout, so the one
loader reads both.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..data.faults import READ_ERRORS, SampleError, SampleFaults, check_files, read_array_shape, reading

__all__ = ["PASTIS_CLASSES", "PASTIS_COLORS", "S2_BANDS", "RGB_BANDS", "NUM_CLASSES", "VOID", "PIXEL_KM2", "FOLDS",
           "TSVIT_PASTIS_STATS", "BandStats", "PatchRecord", "PastisSplit", "fold_splits", "parse_date",
           "day_of_year", "read_metadata", "windows", "collate", "band_stats", "compute_band_stats",
           "read_norm_file", "DEFAULTS", "metadata_path", "check_data"]

PASTIS_CLASSES = ("Background", "Meadow", "Soft winter wheat", "Corn", "Winter barley", "Winter rapeseed",
                  "Spring barley", "Sunflower", "Grapevine", "Beet", "Winter triticale", "Winter durum wheat",
                  "Fruits, vegetables, flowers", "Potatoes", "Leguminous fodder", "Soybeans", "Orchard", "Mixed cereal",
                  "Sorghum", "Void label")
NUM_CLASSES = 19  # background + 18 crop types; the void label is not a class
VOID = 19
# the PASTIS benchmark's colour map (one RGB triple per label, void white)
PASTIS_COLORS = np.array([
    (0, 0, 0), (174, 199, 232), (255, 127, 14), (255, 187, 120), (44, 160, 44), (152, 223, 138), (214, 39, 40),
    (255, 152, 150), (148, 103, 189), (197, 176, 213), (140, 86, 75), (196, 156, 148), (227, 119, 194),
    (247, 182, 210), (127, 127, 127), (199, 199, 199), (188, 189, 34), (219, 219, 141), (23, 190, 207),
    (255, 255, 255)], dtype=np.uint8)
S2_BANDS = ("B2", "B3", "B4", "B5", "B6", "B7", "B8", "B8A", "B11", "B12")
RGB_BANDS = (2, 1, 0)  # B4, B3, B2
PIXEL_KM2 = 1e-4  # one 10 m × 10 m pixel
FOLDS = 5
DEFAULTS = ("synthetic",)


@dataclass(frozen=True)
class BandStats:
    """Per-band mean and standard deviation of the raw reflectances, and where they come from."""

    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.mean) != len(self.std) or not self.mean:
            raise ValueError(f"band statistics need one mean and one std per band, got {len(self.mean)} and "
                             f"{len(self.std)}")
        if any(not np.isfinite(s) or s <= 0 for s in self.std):
            raise ValueError(f"band standard deviations must be positive, got {list(self.std)}")
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))

    @property
    def bands(self) -> int:
        return len(self.mean)

    def to_dict(self) -> Dict[str, Any]:
        return {"mean": list(self.mean), "std": list(self.std), "source": self.source}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "BandStats":
        return cls(tuple(d["mean"]), tuple(d["std"]), d.get("source", ""))

    def normalise(self, x: np.ndarray, axis: int) -> np.ndarray:
        """``(x − mean) / std`` in float32 along the band ``axis``."""
        shape = [1] * x.ndim
        shape[axis] = self.bands
        mean = np.asarray(self.mean, np.float32).reshape(shape)
        inv = (1.0 / np.asarray(self.std, np.float32)).reshape(shape)
        return (x.astype(np.float32) - mean) * inv


# TSViT's normalisation for PASTIS (its data_transforms.Normalize, fold-1 statistics), bands B2 … B12
TSVIT_PASTIS_STATS = BandStats(
    mean=(1165.9398193359375, 1375.6534423828125, 1429.2191162109375, 1764.798828125, 2719.273193359375,
          3063.61181640625, 3205.90185546875, 3319.109619140625, 2422.904296875, 1639.370361328125),
    std=(1942.6156005859375, 1881.9234619140625, 1959.3798828125, 1867.2239990234375, 1754.5850830078125,
         1769.4046630859375, 1784.860595703125, 1767.7100830078125, 1458.963623046875, 1299.2833251953125),
    source="TSViT's PASTIS fold-1 statistics")


def fold_splits(fold: int) -> Dict[str, Tuple[int, ...]]:
    """PASTIS's cyclic 5-fold protocol: fold f → train (f, f+1, f+2), val (f+3,), test (f+4,), folds 1–5."""
    if isinstance(fold, bool) or not isinstance(fold, int) or not 1 <= fold <= FOLDS:
        raise ValueError(f"fold must be 1 … {FOLDS}, got {fold!r}")
    cyc = [(fold - 1 + k) % FOLDS + 1 for k in range(FOLDS)]
    return {"train": tuple(cyc[:3]), "val": (cyc[3],), "test": (cyc[4],)}


def parse_date(value: Any) -> dt.date:
    """A PASTIS date (20180924, "20180924" or "2018-09-24") as a date; anything else is a ValueError."""
    s = str(value).strip()
    if isinstance(value, float) and value.is_integer():
        s = str(int(value))
    for fmt in ("%Y%m%d", "%Y-%m-%d"):
        try:
            return dt.datetime.strptime(s, fmt).date()
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not a date (expected YYYYMMDD)")


def day_of_year(date: dt.date) -> int:
    """0 for January 1st … 364 (365 in leap years) for December 31st."""
    return date.timetuple().tm_yday - 1


@dataclass(frozen=True)
class PatchRecord:
    """One patch of the metadata: its id, fold, dates (in the order of the data array's frames) and facts."""

    patch_id: int
    fold: int
    dates: Tuple[dt.date, ...]
    root: Path
    n_parcel: Optional[int] = None
    cover: Optional[float] = None

    @property
    def s2_path(self) -> Path:
        return self.root / "DATA_S2" / f"S2_{self.patch_id}.npy"

    @property
    def target_path(self) -> Path:
        return self.root / "ANNOTATIONS" / f"TARGET_{self.patch_id}.npy"

    @property
    def order(self) -> np.ndarray:
        """Frame indices sorted by date (stable)."""
        return np.argsort(np.array([d.toordinal() for d in self.dates]), kind="stable")

    @property
    def doy(self) -> np.ndarray:
        """(T,) int64 day of year of the frames, sorted by date."""
        return np.array([day_of_year(self.dates[i]) for i in self.order], dtype=np.int64)


def metadata_path(root: Path) -> Path:
    if not root.is_dir():
        raise FileNotFoundError(f"dataset folder {root} does not exist")
    path = root / "metadata.geojson"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a PASTIS folder holds metadata.geojson, DATA_S2/S2_<ID>.npy and "
                                f"ANNOTATIONS/TARGET_<ID>.npy")
    return path


def read_metadata(root: Union[str, Path]) -> List[PatchRecord]:
    """Every patch of ``<root>/metadata.geojson`` (sorted by id); a malformed file, a feature without ID_PATCH /
    Fold / dates-S2, or a date that does not parse is a ValueError naming the file and the patch."""
    root = Path(root)
    path = metadata_path(root)
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not JSON: {e}") from e
    features = meta.get("features") if isinstance(meta, dict) else None
    if not isinstance(features, list) or not features:
        raise ValueError(f"{path} holds no features (expected a GeoJSON FeatureCollection, one feature per patch)")
    records: List[PatchRecord] = []
    seen = set()
    for n, feat in enumerate(features):
        props = feat.get("properties") if isinstance(feat, dict) else None
        if not isinstance(props, dict):
            raise ValueError(f"{path}: feature {n} has no properties")
        missing = [k for k in ("ID_PATCH", "Fold", "dates-S2") if k not in props]
        if missing:
            raise ValueError(f"{path}: feature {n} lacks {', '.join(missing)}")
        try:
            pid, fold = int(props["ID_PATCH"]), int(props["Fold"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: feature {n} has ID_PATCH {props['ID_PATCH']!r} and Fold {props['Fold']!r}; "
                             f"both must be integers") from e
        if not 1 <= fold <= FOLDS:
            raise ValueError(f"{path}: patch {pid} has Fold {fold}, outside 1 … {FOLDS}")
        if pid in seen:
            raise ValueError(f"{path}: patch {pid} appears twice")
        seen.add(pid)
        raw = props["dates-S2"]
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: patch {pid} has dates-S2 {raw[:60]!r}, not a JSON object") from e
        if not isinstance(raw, dict) or not raw:
            raise ValueError(f"{path}: patch {pid} has no dates-S2 (expected {{\"0\": YYYYMMDD, …}})")
        try:
            keys = sorted(raw, key=int)
        except ValueError as e:
            raise ValueError(f"{path}: patch {pid} has dates-S2 keys {list(raw)[:5]}…; expected frame indices "
                             f"\"0\", \"1\", …") from e
        if [int(k) for k in keys] != list(range(len(keys))):
            raise ValueError(f"{path}: patch {pid} has dates-S2 keys that are not the frame indices 0 … "
                             f"{len(keys) - 1}")
        try:
            dates = tuple(parse_date(raw[k]) for k in keys)
        except ValueError as e:
            raise ValueError(f"{path}: patch {pid}, dates-S2: {e}") from e
        n_parcel = props.get("N_Parcel")
        cover = props.get("Patch_Cover")
        records.append(PatchRecord(pid, fold, dates, root, None if n_parcel is None else int(n_parcel),
                                   None if cover is None else float(cover)))
    return sorted(records, key=lambda r: r.patch_id)


def _header(path: Path) -> Tuple[Tuple[int, ...], np.dtype]:
    with reading(path):
        return read_array_shape(path)


def _open(path: Path) -> np.ndarray:
    """A memory-mapped .npy array; a missing, truncated or malformed file is a SampleError naming it."""
    with reading(path):
        return np.load(path, mmap_mode="r")


def _check_s2(r: PatchRecord, num_bands: int) -> Tuple[int, int]:
    """H × W of a patch's data array, from its header: (T, ``num_bands``, H, W) numbers, T its dates in the
    metadata; else a SampleError naming the file."""
    data = r.s2_path
    shape, dtype = _header(data)
    if len(shape) != 4 or shape[1] != num_bands or shape[0] != len(r.dates):
        raise SampleError(data, f"{data} has shape {shape}; expected (T, {num_bands}, H, W) with T = "
                                f"{len(r.dates)} (the dates of patch {r.patch_id} in metadata.geojson)")
    if not (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)):
        raise SampleError(data, f"{data} holds {dtype}, not numbers")
    return int(shape[2]), int(shape[3])


def _check_target(r: PatchRecord, hw: Optional[Tuple[int, int]]) -> None:
    """A patch's target from its header: (C, H, W) or (H, W) numbers, H × W = ``hw`` (its data's; None when the data
    array is unreadable: any H × W); else a SampleError naming the file."""
    target = r.target_path
    tshape, tdtype = _header(target)
    if hw is None:
        if len(tshape) not in (2, 3):
            raise SampleError(target, f"{target} has shape {tshape}; expected (C, H, W) or (H, W)")
    elif not ((len(tshape) == 3 and tuple(tshape[1:]) == hw) or tuple(tshape) == hw):
        raise SampleError(target, f"{target} has shape {tshape}; expected (C, {hw[0]}, {hw[1]}) like its data "
                                  f"{r.s2_path.name}")
    if not np.issubdtype(tdtype, np.integer) and not np.issubdtype(tdtype, np.floating):
        raise SampleError(target, f"{target} holds {tdtype}, not class ids")


def _check_classes(labels: np.ndarray, path: Path) -> None:
    """Class ids (int64, as :meth:`PastisSplit.labels` reads them) must lie in 0 … VOID; else a SampleError naming
    the target file."""
    if labels.size and (labels.min() < 0 or labels.max() > VOID):
        bad = int(labels.min() if labels.min() < 0 else labels.max())
        raise SampleError(path, f"{path} holds class {bad}, outside 0 … {VOID} (0 background, 1–18 crops, 19 void)")


class PastisSplit:
    """The patches of some folds, checked and read lazily (arrays are memory-mapped, one window at a time).

    At construction every patch's arrays are checked from their headers: the data array must be (T, bands, H, W)
    with T the number of its dates in the metadata, the target (C, H, W) or (H, W) of the same H × W. ``max_frames``
    keeps the first frames by date of longer series (TSViT's cut). A bad file is a :class:`SampleError` naming it,
    here or when read; with ``faults`` skipping bad samples, patches failing the check are left out.
    """

    def __init__(self, root: Union[str, Path], folds: Sequence[int], num_bands: int = 10,
                 max_frames: Optional[int] = None, records: Optional[List[PatchRecord]] = None,
                 patches: Optional[Sequence[int]] = None, faults: Optional[SampleFaults] = None) -> None:
        self.root = Path(root)
        records = read_metadata(self.root) if records is None else records
        folds = tuple(int(f) for f in folds)
        chosen = [r for r in records if r.fold in folds]
        path = self.root / "metadata.geojson"
        if patches is None:
            for f in folds:
                if not any(r.fold == f for r in chosen):
                    raise ValueError(f"{path} has no patch in fold {f}")
        else:
            wanted = {int(p) for p in patches}
            chosen = [r for r in chosen if r.patch_id in wanted]
            absent = sorted(wanted - {r.patch_id for r in chosen})
            if absent:
                raise ValueError(f"{path} has no patch {absent[0]} in fold(s) {', '.join(map(str, folds))}")
        self.folds = folds
        self.num_bands = num_bands
        self.max_frames = max_frames
        faults = faults if faults is not None else SampleFaults()
        self.records: List[PatchRecord] = []
        self.sizes: List[Tuple[int, int]] = []
        for r in chosen:
            try:
                self.sizes.append(self._check(r))
            except SampleError as e:
                faults.record(e)
                continue
            self.records.append(r)
        if not self.records:
            raise ValueError(f"none of the {len(chosen)} patches of fold(s) {', '.join(map(str, folds))} of "
                             f"{self.root} is readable")

    def _check(self, r: PatchRecord) -> Tuple[int, int]:
        """H × W of a patch whose arrays' headers agree with each other and with the metadata."""
        hw = _check_s2(r, self.num_bands)
        _check_target(r, hw)
        return hw

    def __len__(self) -> int:
        return len(self.records)

    def index_of(self, patch_id: int) -> int:
        for i, r in enumerate(self.records):
            if r.patch_id == int(patch_id):
                return i
        raise ValueError(f"patch {patch_id} is not in fold(s) {', '.join(map(str, self.folds))} of {self.root}")

    def frames(self, i: int) -> np.ndarray:
        """Indices of the frames read for patch i: sorted by date, the first ``max_frames``."""
        return self.records[i].order[:self.max_frames]

    def doy(self, i: int) -> np.ndarray:
        return self.records[i].doy[:self.max_frames]

    def labels(self, i: int, top: int = 0, left: int = 0, size: Optional[int] = None) -> np.ndarray:
        """(h, w) int64 classes of a window (the whole patch when ``size`` is None)."""
        r = self.records[i]
        t = _open(r.target_path)
        t = t[0] if t.ndim == 3 else t
        H, W = t.shape
        hs, ws = (H, W) if size is None else (size, size)
        out = np.asarray(t[top:top + hs, left:left + ws]).astype(np.int64)
        _check_classes(out, r.target_path)
        return out

    def bands(self, i: int, top: int = 0, left: int = 0, size: Optional[int] = None,
              stats: Optional[BandStats] = None) -> np.ndarray:
        """(T, h, w, bands) float32 of a window, frames sorted by date, normalised with ``stats`` when given."""
        r = self.records[i]
        a = _open(r.s2_path)
        H, W = a.shape[2:]
        hs, ws = (H, W) if size is None else (size, size)
        if top < 0 or left < 0 or top + hs > H or left + ws > W:
            raise ValueError(f"window {hs}×{ws} at ({top}, {left}) leaves patch {r.patch_id} ({H}×{W})")
        x = np.asarray(a[:, :, top:top + hs, left:left + ws])[self.frames(i)]
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        return stats.normalise(x, axis=-1) if stats is not None else x.astype(np.float32)

    def sample(self, i: int, top: int = 0, left: int = 0, size: Optional[int] = None,
               stats: Optional[BandStats] = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bands (T, h, w, C) float32, day of year (T,) int64, labels (h, w) int64) of a window."""
        return self.bands(i, top, left, size, stats), self.doy(i), self.labels(i, top, left, size)


def windows(split: PastisSplit, size: Optional[int]) -> List[Tuple[int, int, int]]:
    """(patch index, top, left) of every training window: the non-overlapping ``size`` × ``size`` windows of each
    patch in row-major order, the remainder dropped (128 / 24 → 25 windows); ``size=None`` → one whole patch each."""
    out = []
    for i, (H, W) in enumerate(split.sizes):
        if size is None:
            out.append((i, 0, 0))
            continue
        if size > min(H, W):
            raise ValueError(f"window {size} is larger than patch {split.records[i].patch_id} ({H}×{W})")
        out += [(i, t, c) for t in range(0, H - size + 1, size) for c in range(0, W - size + 1, size)]
    return out


def collate(samples: Sequence[Tuple[np.ndarray, np.ndarray, np.ndarray]]
            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Series of different lengths → (x (B, T, H, W, C) float32, doy (B, T) int64, mask (B, T) bool, labels
    (B, H, W) int64): frames padded at the end with zeros (day 0), mask False there."""
    if not samples:
        raise ValueError("an empty batch")
    shapes = {s[0].shape[1:] for s in samples}
    if len(shapes) != 1:
        raise ValueError(f"windows of a batch must share (H, W, bands), got {sorted(shapes)}")
    T = max(s[0].shape[0] for s in samples)
    B = len(samples)
    x = np.zeros((B, T) + samples[0][0].shape[1:], np.float32)
    doy = np.zeros((B, T), np.int64)
    mask = np.zeros((B, T), bool)
    for b, (xs, ds, _) in enumerate(samples):
        n = xs.shape[0]
        x[b, :n], doy[b, :n], mask[b, :n] = xs, ds, True
    labels = np.stack([s[2] for s in samples])
    return torch.from_numpy(x), torch.from_numpy(doy), torch.from_numpy(mask), torch.from_numpy(labels)


# ----------------------------------------------------------------------------------------------------------------
# Band statistics
# ----------------------------------------------------------------------------------------------------------------


def read_norm_file(root: Union[str, Path], folds: Sequence[int]) -> Optional[BandStats]:
    """The mean over ``folds`` of the per-fold statistics in ``<root>/NORM_S2_patch.json`` (as the PASTIS loader
    does), or None when the file is absent."""
    path = Path(root) / "NORM_S2_patch.json"
    if not path.is_file():
        return None
    try:
        norm = json.loads(path.read_text(encoding="utf-8"))
        means = [norm[f"Fold_{f}"]["mean"] for f in folds]
        stds = [norm[f"Fold_{f}"]["std"] for f in folds]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path} lacks the statistics of fold(s) {list(folds)} "
                         f"(expected {{\"Fold_k\": {{\"mean\": [...], \"std\": [...]}}}}): {e}") from e
    return BandStats(tuple(np.mean(means, axis=0)), tuple(np.mean(stds, axis=0)),
                     f"{path.name}, folds {', '.join(map(str, folds))}")


def compute_band_stats(split: PastisSplit, max_patches: int = 64, stride: int = 4) -> BandStats:
    """Per-band mean and std over the frames of (at most ``max_patches``, evenly spread) patches of a split, every
    ``stride``-th pixel in both directions, accumulated in float64."""
    n = len(split)
    pick = np.unique(np.linspace(0, n - 1, min(n, max_patches)).round().astype(int))
    s = np.zeros(split.num_bands)
    s2 = np.zeros(split.num_bands)
    count = 0
    for i in pick:
        a = _open(split.records[i].s2_path)
        x = np.asarray(a[:, :, ::stride, ::stride], dtype=np.float64)
        s += x.sum((0, 2, 3))
        s2 += np.square(x).sum((0, 2, 3))
        count += x.shape[0] * x.shape[2] * x.shape[3]
    mean = s / count
    std = np.sqrt(np.maximum(s2 / count - mean ** 2, 1e-12))
    return BandStats(tuple(mean), tuple(std), f"computed from {len(pick)} training patches of folds "
                                               f"{', '.join(map(str, split.folds))}")


def band_stats(split: PastisSplit, mode: str = "auto") -> BandStats:
    """The statistics to normalise with: ``"auto"`` → NORM_S2_patch.json's training folds when present, else
    computed from the training split; ``"file"`` / ``"computed"`` force one; ``"tsvit"`` → TSViT's published PASTIS
    fold-1 statistics."""
    if mode == "tsvit":
        if split.num_bands != TSVIT_PASTIS_STATS.bands:
            raise ValueError(f"TSViT's statistics are for {TSVIT_PASTIS_STATS.bands} bands, the data has "
                             f"{split.num_bands}")
        return TSVIT_PASTIS_STATS
    if mode not in ("auto", "file", "computed"):
        raise ValueError(f"normalisation must be 'auto', 'file', 'computed' or 'tsvit', got {mode!r}")
    if mode in ("auto", "file"):
        stats = read_norm_file(split.root, split.folds)
        if stats is not None:
            if stats.bands != split.num_bands:
                raise ValueError(f"{split.root / 'NORM_S2_patch.json'} has {stats.bands} bands, the data "
                                 f"{split.num_bands}")
            return stats
        if mode == "file":
            raise FileNotFoundError(f"{split.root / 'NORM_S2_patch.json'} not found")
    return compute_band_stats(split)


# ----------------------------------------------------------------------------------------------------------------
# Upfront check
# ----------------------------------------------------------------------------------------------------------------


def check_data(data: Union[str, Path], progress: bool = True, num_bands: int = len(S2_BANDS)
               ) -> List[Tuple[str, str]]:
    """Every bad file of a PASTIS folder with its reason, in one pass (``polymixer check-data eo`` and the scan
    before ``train``), so that a run fails in its first minute instead of when the sampler draws the patch.

    metadata.geojson must parse; each patch's data and target arrays must exist with readable ``.npy`` headers and
    all the bytes their headers promise, agree in shape with each other and with the patch's dates (the checks
    :class:`PastisSplit` makes, on every patch of every fold), and the target's class channel must hold 0 … 19 (the
    only array read, and the smallest). The bands are read from no file.
    """
    root = Path(data)
    try:
        records = read_metadata(root)
    except READ_ERRORS as e:
        where = root / "metadata.geojson" if root.is_dir() else root
        return [(str(where), str(e))]

    def check(item: Tuple[PatchRecord, bool]) -> None:
        r, is_target = item
        if not is_target:
            _check_s2(r, num_bands)
            return
        try:
            hw: Optional[Tuple[int, int]] = _check_s2(r, num_bands)
        except SampleError:
            hw = None  # reported for the data file; the target is checked on its own
        _check_target(r, hw)
        t = _open(r.target_path)
        _check_classes(np.asarray(t[0] if t.ndim == 3 else t).astype(np.int64), r.target_path)

    items = [(r, t) for r in records for t in (False, True)]
    return check_files(items, check, lambda it: str(it[0].target_path if it[1] else it[0].s2_path), progress,
                       desc=f"check {root.name}")
