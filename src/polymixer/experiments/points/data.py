"""3-D point clouds for semantic segmentation (Point Transformer V3): the ScanNet, SemanticKITTI and ``.ply`` formats,
their checks, PTv3's training augmentations and voxelisation.

The formats, read with numpy (and plyfile for ``.ply``)::

    ScanNet (as Pointcept's preprocessing writes it)
        <root>/{train,val,test}/sceneXXXX_XX/coord.npy      float (N, 3) metres
                                             color.npy      uint8 (N, 3) 0–255
                                             normal.npy     float (N, 3)
                                             segment20.npy  int (N,) ScanNet-20 classes, −1 ignore (segment.npy
                                                            accepted too; absent in test → unlabelled)
    SemanticKITTI
        <root>/sequences/XX/velodyne/NNNNNN.bin    float32 (x, y, z, remission) per point
        <root>/sequences/XX/labels/NNNNNN.label    uint32 per point: lower 16 bits the raw semantic id (mapped through
                                                   the official learning map), upper 16 bits the instance (unused)
        train = sequences 00–07, 09, 10; val = 08; test = 11–21 (no labels)
    .ply
        <root>/{train,val,test}/*.ply   per vertex x, y, z, optional red/green/blue, nx/ny/nz and a label property
                                        (label / class / segment / scalar_label); classes and features as ScanNet

Model inputs: ScanNet and ``.ply`` → colour / 255 then normal (6 channels); SemanticKITTI → x, y, z, remission.
Every loader checks what it reads and raises a ValueError naming the file and the problem.

The offline default (no download) is written by :mod:`polymixer.experiments.points.synth` in the ScanNet layout, so
the one
loader reads both.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..data.faults import READ_ERRORS, check_files, read_array_shape, reading

__all__ = ["labelled_split", "Scene", "PointFormat", "FORMATS", "IGNORE", "SCANNET20_CLASSES", "SEMANTICKITTI_CLASSES",
           "SEMANTICKITTI_LEARNING_MAP", "SEMANTICKITTI_SPLITS", "SPLITS", "load_scannet_scene",
           "load_semantickitti_scan", "load_ply", "write_ply", "PointDataset", "detect_format", "voxelize", "collate",
           "Batch", "AugmentConfig", "augment", "check_data"]

PathLike = Union[str, Path]
IGNORE = -1
SPLITS = ("train", "val", "test")

SCANNET20_CLASSES = ("wall", "floor", "cabinet", "bed", "chair", "sofa", "table", "door", "window", "bookshelf",
                     "picture", "counter", "desk", "curtain", "refrigerator", "shower curtain", "toilet", "sink",
                     "bathtub", "otherfurniture")
SEMANTICKITTI_CLASSES = ("car", "bicycle", "motorcycle", "truck", "other-vehicle", "person", "bicyclist",
                         "motorcyclist", "road", "parking", "sidewalk", "other-ground", "building", "fence",
                         "vegetation", "trunk", "terrain", "pole", "traffic-sign")

# The official SemanticKITTI learning map (semantic-kitti.yaml): raw semantic id → cross-entropy id, 0 = ignored.
# Loaded labels are this minus one: ignored → −1, the 19 classes → 0 … 18.
SEMANTICKITTI_LEARNING_MAP: Dict[int, int] = {
    0: 0,  # unlabeled
    1: 0,  # outlier
    10: 1,  # car
    11: 2,  # bicycle
    13: 5,  # bus → other-vehicle
    15: 3,  # motorcycle
    16: 5,  # on-rails → other-vehicle
    18: 4,  # truck
    20: 5,  # other-vehicle
    30: 6,  # person
    31: 7,  # bicyclist
    32: 8,  # motorcyclist
    40: 9,  # road
    44: 10,  # parking
    48: 11,  # sidewalk
    49: 12,  # other-ground
    50: 13,  # building
    51: 14,  # fence
    52: 0,  # other-structure → unlabeled
    60: 9,  # lane-marking → road
    70: 15,  # vegetation
    71: 16,  # trunk
    72: 17,  # terrain
    80: 18,  # pole
    81: 19,  # traffic-sign
    99: 0,  # other-object → unlabeled
    252: 1,  # moving-car → car
    253: 7,  # moving-bicyclist → bicyclist
    254: 6,  # moving-person → person
    255: 8,  # moving-motorcyclist → motorcyclist
    256: 5,  # moving-on-rails → other-vehicle
    257: 5,  # moving-bus → other-vehicle
    258: 4,  # moving-truck → truck
    259: 5,  # moving-other-vehicle → other-vehicle
}
_UNKNOWN = -2
_KITTI_LUT = np.full(1 << 16, _UNKNOWN, np.int64)
for _raw, _ce in SEMANTICKITTI_LEARNING_MAP.items():
    _KITTI_LUT[_raw] = _ce - 1

SEMANTICKITTI_SPLITS: Dict[str, Tuple[str, ...]] = {
    "train": ("00", "01", "02", "03", "04", "05", "06", "07", "09", "10"),
    "val": ("08",),
    "test": tuple(f"{s:02d}" for s in range(11, 22)),
}
_PLY_LABELS = ("label", "class", "segment", "scalar_label")


@dataclass
class Scene:
    """One point cloud: coordinates, model input features, per-point classes (−1 ignore; None when unlabelled) and,
    when the format has them, the colours (for plots and ``.ply`` export)."""

    name: str
    coord: np.ndarray
    feat: np.ndarray
    segment: Optional[np.ndarray]
    color: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return int(self.coord.shape[0])


@dataclass(frozen=True)
class PointFormat:
    """What a format's scenes hold: class names, input channels, PTv3's voxel size and the feature layout."""

    name: str
    class_names: Tuple[str, ...]
    in_channels: int
    grid_size: float
    feature_desc: str

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def has_color(self) -> bool:
        """Whether features start with colour / 255 and then hold normals (ScanNet-like)."""
        return self.name != "semantickitti"


FORMATS: Dict[str, PointFormat] = {
    "scannet": PointFormat("scannet", SCANNET20_CLASSES, 6, 0.02, "colour r, g, b / 255, then normal nx, ny, nz"),
    "semantickitti": PointFormat("semantickitti", SEMANTICKITTI_CLASSES, 4, 0.05, "x, y, z (metres), remission"),
    "ply": PointFormat("ply", SCANNET20_CLASSES, 6, 0.02, "colour r, g, b / 255, then normal nx, ny, nz"),
}


def _format(name: str) -> PointFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown point-cloud format {name!r}; expected one of {', '.join(FORMATS)}")
    return FORMATS[name]


# ----------------------------------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------------------------------


def _load_npy(path: Path) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path} is not a readable .npy array: {e}") from e


def _numbers(dtype: np.dtype) -> bool:
    return bool(np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer))


def _check_coord_header(shape: Tuple[int, ...], dtype: np.dtype, where: object) -> int:
    """The number of points N of coordinates of this shape and dtype: (N ≥ 1, 3) numbers."""
    if len(shape) != 2 or shape[1] != 3:
        raise ValueError(f"{where}: coordinates have shape {shape}; expected (N, 3)")
    if not _numbers(dtype):
        raise ValueError(f"{where}: coordinates hold {dtype}, not numbers")
    if shape[0] == 0:
        raise ValueError(f"{where}: the scene is empty (0 points)")
    return int(shape[0])


def _check_coord(coord: np.ndarray, where: object) -> np.ndarray:
    coord = np.asarray(coord)
    _check_coord_header(coord.shape, coord.dtype, where)
    coord = coord.astype(np.float32)
    if not np.isfinite(coord).all():
        bad = int((~np.isfinite(coord)).any(1).sum())
        raise ValueError(f"{where}: {bad} point(s) have NaN or infinite coordinates")
    return coord


def _check_rows_header(shape: Tuple[int, ...], dtype: np.dtype, n: int, cols: int, what: str, where: object) -> None:
    """Per-point rows of this shape and dtype: (n, cols) numbers."""
    if len(shape) != 2 or shape[1] != cols:
        raise ValueError(f"{where}: {what} have shape {shape}; expected ({n}, {cols})")
    if shape[0] != n:
        raise ValueError(f"{where}: {shape[0]} {what} for {n} points (lengths differ)")
    if not _numbers(dtype):
        raise ValueError(f"{where}: {what} hold {dtype}, not numbers")


def _check_rows(a: np.ndarray, n: int, cols: int, what: str, where: object) -> np.ndarray:
    a = np.asarray(a)
    _check_rows_header(a.shape, a.dtype, n, cols, what, where)
    return a


def _check_color(color: np.ndarray, n: int, where: object) -> np.ndarray:
    """uint8 colours; floats in [0, 1] are read as fractions of 255."""
    color = _check_rows(color, n, 3, "colours", where)
    if color.dtype == np.uint8:
        return color
    c = color.astype(np.float64)
    if not np.isfinite(c).all():
        raise ValueError(f"{where}: colours hold NaN or infinite values")
    if np.issubdtype(color.dtype, np.floating) and c.size and c.max() <= 1.0 and c.min() >= 0.0:
        c = c * 255.0
    if c.size and (c.min() < 0 or c.max() > 255):
        raise ValueError(f"{where}: colours span {c.min():g} … {c.max():g}; expected 0 … 255")
    return np.rint(c).astype(np.uint8)


def _check_normal(normal: np.ndarray, n: int, where: object) -> np.ndarray:
    normal = _check_rows(normal, n, 3, "normals", where).astype(np.float32)
    if not np.isfinite(normal).all():
        raise ValueError(f"{where}: normals hold NaN or infinite values")
    return normal


def _check_segment(segment: np.ndarray, n: int, num_classes: int, where: object) -> np.ndarray:
    seg = np.asarray(segment)
    if seg.ndim == 2 and seg.shape[1] == 1:
        seg = seg[:, 0]
    if seg.ndim != 1:
        raise ValueError(f"{where}: labels have shape {seg.shape}; expected ({n},)")
    if seg.shape[0] != n:
        raise ValueError(f"{where}: {seg.shape[0]} labels for {n} points (lengths differ)")
    if np.issubdtype(seg.dtype, np.floating):
        if not np.isfinite(seg).all() or (seg != np.round(seg)).any():
            raise ValueError(f"{where}: labels are not whole numbers")
    elif not np.issubdtype(seg.dtype, np.integer):
        raise ValueError(f"{where}: labels hold {seg.dtype}, not class ids")
    seg = seg.astype(np.int64)
    bad = (seg < IGNORE) | (seg >= num_classes)
    if bad.any():
        vals = np.unique(seg[bad])[:5].tolist()
        raise ValueError(f"{where}: labels {vals} outside −1 … {num_classes - 1} ({int(bad.sum())} point(s))")
    return seg


# ----------------------------------------------------------------------------------------------------------------
# Loaders
# ----------------------------------------------------------------------------------------------------------------


def load_scannet_scene(folder: PathLike) -> Scene:
    """A scene folder in Pointcept's ScanNet layout (coord / color / normal / segment20 ``.npy``); features are colour
    / 255 then normal; without ``segment20.npy`` (or ``segment.npy``) the scene is unlabelled."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"scene folder {folder} not found")
    path = folder / "coord.npy"
    coord = _check_coord(_load_npy(path), path)
    n = coord.shape[0]
    path = folder / "color.npy"
    color = _check_color(_load_npy(path), n, path)
    path = folder / "normal.npy"
    normal = _check_normal(_load_npy(path), n, path)
    segment = None
    for fname in ("segment20.npy", "segment.npy"):
        path = folder / fname
        if path.is_file():
            segment = _check_segment(_load_npy(path), n, len(SCANNET20_CLASSES), path)
            break
    feat = np.concatenate([color.astype(np.float32) / 255.0, normal], 1)
    return Scene(folder.name, coord, feat, segment, color)


def _kitti_name(bin_path: Path) -> str:
    if bin_path.parent.name == "velodyne":
        return f"{bin_path.parent.parent.name}/{bin_path.stem}"
    return bin_path.stem


def load_semantickitti_scan(bin_path: PathLike, label_path: Optional[PathLike] = None) -> Scene:
    """One SemanticKITTI scan: float32 (x, y, z, remission) from ``bin_path``; labels (when ``label_path`` is given)
    mapped through the official learning map to 0 … 18, ignored → −1. Features are x, y, z, remission."""
    bin_path = Path(bin_path)
    _kitti_points(bin_path)
    pts = np.fromfile(bin_path, dtype=np.float32).reshape(-1, 4)
    coord = _check_coord(pts[:, :3], bin_path)
    if not np.isfinite(pts[:, 3]).all():
        raise ValueError(f"{bin_path}: remission holds NaN or infinite values")
    n = coord.shape[0]
    segment = None
    if label_path is not None:
        label_path = Path(label_path)
        _kitti_label_count(label_path, n, bin_path)
        segment = _kitti_segment(np.fromfile(label_path, dtype=np.uint32), label_path)
    feat = np.concatenate([coord, pts[:, 3:4]], 1).astype(np.float32)
    return Scene(_kitti_name(bin_path), coord, feat, segment, None)


def _kitti_points(bin_path: Path) -> int:
    """The number of points of a SemanticKITTI scan from its file size (16 bytes a point), at least one."""
    if not bin_path.is_file():
        raise FileNotFoundError(f"{bin_path} not found")
    size = bin_path.stat().st_size
    if size % 16:
        raise ValueError(f"{bin_path} has {size} bytes, not a multiple of 16 (4 float32 per point: x, y, z, "
                         f"remission)")
    return _check_coord_header((size // 16, 3), np.dtype(np.float32), bin_path)


def _kitti_label_count(label_path: Path, n: Optional[int], bin_path: Path) -> None:
    """A label file of one uint32 per point, ``n`` of them (any number when ``n`` is None: its scan is bad)."""
    if not label_path.is_file():
        raise FileNotFoundError(f"{label_path} not found")
    size = label_path.stat().st_size
    if size % 4:
        raise ValueError(f"{label_path} has {size} bytes, not a multiple of 4 (one uint32 per point)")
    if n is not None and size // 4 != n:
        raise ValueError(f"{label_path} has {size // 4} labels for the {n} points of {bin_path.name} "
                         f"(lengths differ)")


def _kitti_segment(raw: np.ndarray, label_path: Path) -> np.ndarray:
    """Raw SemanticKITTI labels mapped through the learning map (0 … 18, ignored → −1); an id outside the map is a
    ValueError naming the file."""
    segment = _KITTI_LUT[(raw & 0xFFFF).astype(np.int64)]
    bad = segment == _UNKNOWN
    if bad.any():
        vals = np.unique(raw[bad] & 0xFFFF)[:5].tolist()
        raise ValueError(f"{label_path}: raw semantic ids {vals} are not in the SemanticKITTI learning map "
                         f"({int(bad.sum())} point(s))")
    return segment


def _ply_field(v: np.ndarray, names: Sequence[str]) -> Optional[str]:
    for nm in names:
        if nm in v.dtype.names:
            return nm
    return None


def _ply_vertices(path: Path) -> np.ndarray:
    """The vertex records of a ``.ply`` file, with x, y and z (plyfile memory-maps binary vertex data: the header is
    parsed and the length checked, no vertex is read)."""
    from plyfile import PlyData

    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    try:
        ply = PlyData.read(str(path))
    except Exception as e:  # plyfile raises several types on malformed files
        raise ValueError(f"{path} is not a readable .ply file: {e}") from e
    if "vertex" not in [el.name for el in ply.elements]:
        raise ValueError(f"{path} has no vertex element")
    v = ply["vertex"].data
    missing = [k for k in "xyz" if k not in v.dtype.names]
    if missing:
        raise ValueError(f"{path}: the vertices lack {', '.join(missing)}")
    return v


def load_ply(path: PathLike, format: str = "scannet") -> Scene:
    """A ``.ply`` point cloud: vertex x, y, z, optional red/green/blue (missing → zeros), nx/ny/nz (missing → zeros)
    and a label (label / class / segment / scalar_label; missing → unlabelled). ``format`` gives the classes and the
    feature layout: ``scannet`` / ``ply`` → colour / 255, normal; ``semantickitti`` → x, y, z and the remission /
    intensity property (missing → zeros)."""
    fmt = _format(format)
    path = Path(path)
    v = _ply_vertices(path)
    coord = _check_coord(np.stack([v["x"], v["y"], v["z"]], 1), path)
    n = coord.shape[0]
    color = None
    if all(k in v.dtype.names for k in ("red", "green", "blue")):
        color = _check_color(np.stack([v["red"], v["green"], v["blue"]], 1), n, path)
    key = _ply_field(v, _PLY_LABELS)
    segment = None if key is None else _check_segment(np.asarray(v[key]), n, fmt.num_classes, f"{path} ({key})")
    if fmt.has_color:
        if all(k in v.dtype.names for k in ("nx", "ny", "nz")):
            normal = _check_normal(np.stack([v["nx"], v["ny"], v["nz"]], 1), n, path)
        else:
            normal = np.zeros((n, 3), np.float32)
        rgb = np.zeros((n, 3), np.float32) if color is None else color.astype(np.float32) / 255.0
        feat = np.concatenate([rgb, normal], 1)
    else:
        key = _ply_field(v, ("remission", "intensity", "scalar_intensity", "reflectance"))
        rem = np.zeros(n, np.float32) if key is None else np.asarray(v[key], np.float32)
        if not np.isfinite(rem).all():
            raise ValueError(f"{path}: {key} holds NaN or infinite values")
        feat = np.concatenate([coord, rem[:, None]], 1)
    return Scene(path.stem, coord, feat.astype(np.float32), segment, color)


def write_ply(path: PathLike, coord: np.ndarray, color: Optional[np.ndarray], label: Optional[np.ndarray] = None
              ) -> None:
    """A binary little-endian ``.ply`` of vertices x, y, z (float32), red, green, blue (uint8; zeros when ``color`` is
    None) and, when given, ``label`` (int32, −1 kept) — readable by :func:`load_ply`, CloudCompare and MeshLab."""
    from plyfile import PlyData, PlyElement

    path = Path(path)
    coord = np.asarray(coord)
    if coord.ndim != 2 or coord.shape[1] != 3:
        raise ValueError(f"{path}: coordinates have shape {coord.shape}; expected (N, 3)")
    n = coord.shape[0]
    color = np.zeros((n, 3), np.uint8) if color is None else _check_color(color, n, path)
    dtype = [("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")]
    if label is not None:
        label = np.asarray(label).reshape(-1)
        if label.shape[0] != n:
            raise ValueError(f"{path}: {label.shape[0]} labels for {n} points (lengths differ)")
        dtype.append(("label", "<i4"))
    v = np.empty(n, dtype=dtype)
    v["x"], v["y"], v["z"] = coord[:, 0], coord[:, 1], coord[:, 2]
    v["red"], v["green"], v["blue"] = color[:, 0], color[:, 1], color[:, 2]
    if label is not None:
        v["label"] = label
    path.parent.mkdir(parents=True, exist_ok=True)
    PlyData([PlyElement.describe(v, "vertex")], text=False, byte_order="<").write(str(path))


# ----------------------------------------------------------------------------------------------------------------
# Datasets
# ----------------------------------------------------------------------------------------------------------------


def _split_dirs(root: Path) -> List[Path]:
    return [root / s for s in SPLITS if (root / s).is_dir()]


def detect_format(root: PathLike) -> str:
    """``scannet`` if a split folder (train / val / test) holds scene folders with ``coord.npy``, ``semantickitti``
    if ``root/sequences`` exists, ``ply`` if a split folder holds ``.ply`` files; else a ValueError."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"dataset folder {root} does not exist")
    if (root / "sequences").is_dir():
        return "semantickitti"
    splits = _split_dirs(root)
    if any(any(d.is_dir() and (d / "coord.npy").is_file() for d in s.iterdir()) for s in splits):
        return "scannet"
    if any(any(s.glob("*.ply")) for s in splits):
        return "ply"
    raise ValueError(f"{root} is not a point-cloud dataset: expected {{train,val,test}}/<scene>/coord.npy (ScanNet, "
                     f"as Pointcept preprocesses it), sequences/XX/velodyne/*.bin (SemanticKITTI) or "
                     f"{{train,val,test}}/*.ply")


def labelled_split(root: PathLike, format: Optional[str] = None) -> str:
    """The first split with labels, ``test`` else ``val``: ScanNet's and SemanticKITTI's test scenes carry none, so an
    evaluation that defaults to the test split takes validation there (and says so)."""
    try:
        ds = PointDataset(root, "test", format)
    except (FileNotFoundError, ValueError):
        return "val"
    if ds.format.name == "semantickitti":
        return "test" if all(label is not None for _, label in ds.paths) else "val"
    if ds.format.name == "scannet":
        first = ds.paths[0][0]
        return "test" if (first / "segment20.npy").is_file() or (first / "segment.npy").is_file() else "val"
    return "test"


class PointDataset:
    """The scenes of one split of a dataset folder, loaded from disk on access (the last ``cache`` scenes are kept;
    each access returns fresh copies, so callers may modify them). ``format`` None → :func:`detect_format`."""

    def __init__(self, root: PathLike, split: str, format: Optional[str] = None, cache: int = 8) -> None:
        self.root = Path(root)
        self.split = split
        self.format = _format(detect_format(self.root) if format is None else format)
        self._cache: "OrderedDict[int, Scene]" = OrderedDict()
        self._cache_size = max(0, int(cache))
        self.paths: List[Tuple[Path, Optional[Path]]] = []
        name = self.format.name
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if name == "semantickitti":
            seq_root = self.root / "sequences"
            if not seq_root.is_dir():
                raise FileNotFoundError(f"{seq_root} not found (SemanticKITTI keeps its scans in "
                                        f"sequences/XX/velodyne)")
            self.names = []
            for seq in SEMANTICKITTI_SPLITS[split]:
                velo = seq_root / seq / "velodyne"
                for b in sorted(velo.glob("*.bin")) if velo.is_dir() else []:
                    lab = seq_root / seq / "labels" / f"{b.stem}.label"
                    # test scans have no labels; train / val labels are required (a FileNotFoundError on access)
                    self.paths.append((b, lab if (split != "test" or lab.is_file()) else None))
                    self.names.append(f"{seq}/{b.stem}")
            where = f"{seq_root}/{{{','.join(SEMANTICKITTI_SPLITS[split])}}}/velodyne"
        else:
            folder = self.root / split
            if not folder.is_dir():
                raise FileNotFoundError(f"split folder {folder} not found")
            if name == "scannet":
                items = sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
            else:
                items = sorted(folder.glob("*.ply"))
            self.paths = [(p, None) for p in items]
            self.names = [p.name if name == "scannet" else p.stem for p in items]
            where = str(folder)
        if not self.names:
            raise ValueError(f"{where} holds no {name} scenes")

    def __len__(self) -> int:
        return len(self.names)

    def load(self, i: int) -> Scene:
        """Scene ``i`` read from disk (no cache); a missing, unreadable or malformed file is a
        :class:`~polymixer.experiments.data.faults.SampleError` naming it."""
        path, label = self.paths[i]
        with reading(path):
            if self.format.name == "scannet":
                return load_scannet_scene(path)
            if self.format.name == "semantickitti":
                return load_semantickitti_scan(path, label)
            return load_ply(path, "scannet")

    def __getitem__(self, i: int) -> Scene:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"scene {i} out of range for {n} scenes")
        i %= n
        scene = self._cache.get(i)
        if scene is None:
            scene = self.load(i)
            if self._cache_size:
                self._cache[i] = scene
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(i)
        return Scene(scene.name, scene.coord.copy(), scene.feat.copy(),
                     None if scene.segment is None else scene.segment.copy(),
                     None if scene.color is None else scene.color.copy())

    def __repr__(self) -> str:
        return f"PointDataset({str(self.root)!r}, {self.split!r}, format={self.format.name!r}, {len(self)} scenes)"


# ----------------------------------------------------------------------------------------------------------------
# Upfront check
# ----------------------------------------------------------------------------------------------------------------


def _scannet_points(folder: Path) -> Optional[int]:
    """N from the header of a scene's coord.npy; None when that file is bad (it is reported on its own)."""
    path = folder / "coord.npy"
    try:
        shape, dtype = read_array_shape(path)
        return _check_coord_header(shape, dtype, path)
    except READ_ERRORS:
        return None


def _check_scannet_file(path: Path) -> None:
    """One array of a ScanNet scene: a readable header, every byte it promises, the shape and dtype the loader
    expects and one row per point of the scene; the labels (small) are read and checked as the loader does."""
    shape, dtype = read_array_shape(path)
    if path.name == "coord.npy":
        _check_coord_header(shape, dtype, path)
        return
    n = _scannet_points(path.parent)  # None: coord.npy is bad (reported), so no length to compare with
    if path.name in ("color.npy", "normal.npy"):
        n = (shape[0] if shape else 0) if n is None else n
        _check_rows_header(shape, dtype, n, 3, "colours" if path.name == "color.npy" else "normals", path)
    else:
        seg = _load_npy(path)
        _check_segment(seg, (seg.shape[0] if seg.ndim else 0) if n is None else n, len(SCANNET20_CLASSES), path)


def _check_kitti_labels(label_path: Path, bin_path: Path) -> None:
    """A scan's label file: one uint32 per point of the scan (from the two file sizes), every id in the learning
    map (the labels are read: a quarter of the scan's size)."""
    try:
        n: Optional[int] = _kitti_points(bin_path)
    except READ_ERRORS:
        n = None  # the scan is reported on its own
    _kitti_label_count(label_path, n, bin_path)
    _kitti_segment(np.fromfile(label_path, dtype=np.uint32), label_path)


def _check_ply_file(path: Path) -> None:
    """A ``.ply`` scene from its header (binary files: the length too): a vertex element with x, y, z, at least one
    vertex."""
    v = _ply_vertices(path)
    _check_coord_header((len(v), 3), np.result_type(*(v.dtype[k] for k in "xyz")), path)


def check_data(data: PathLike, progress: bool = True, format: Optional[str] = None) -> List[Tuple[str, str]]:
    """Every bad file of a point-cloud dataset with its reason, in one pass over every scene of every split present
    (``polymixer check-data points`` and the scan before ``train``), so that a run fails in its first minute instead
    of when the sampler draws the scene. ``format`` None → :func:`detect_format`.

    Headers and sizes are read, not the points: ScanNet's ``.npy`` files must be readable and hold every byte their
    headers promise, coordinates (N ≥ 1, 3), colours and normals (N, 3); SemanticKITTI's ``.bin`` must hold 16 bytes
    a point and its ``.label`` 4 bytes a point; ``.ply`` files must have a vertex element with x, y, z. The label
    arrays are read (a fraction of a scene) and checked as the loaders do: one per point, classes in range. What the
    loaders check in the data itself (finite coordinates, colour ranges) is left to them.
    """
    root = Path(data)
    if not root.is_dir():
        return [(str(root), f"dataset folder {root} does not exist")]
    try:
        name = detect_format(root) if format is None else format
    except ValueError as e:
        return [(str(root), str(e))]
    _format(name)  # an unknown name is a usage error, not a bad file
    bad: List[Tuple[str, str]] = []
    items: List[Tuple[Path, Callable[[Path], object]]] = []
    absent: List[str] = []
    for split in SPLITS:
        try:
            ds = PointDataset(root, split, name, cache=0)
        except FileNotFoundError as e:  # no such split
            absent.append(str(e))
            continue
        except ValueError as e:
            if name == "semantickitti":  # none of the split's sequences is present
                absent.append(str(e))
            else:  # a split folder without scenes
                bad.append((str(root / split), str(e)))
            continue
        for path, label in ds.paths:
            if name == "scannet":
                seg = [path / f for f in ("segment20.npy", "segment.npy") if (path / f).is_file()][:1]
                items += [(f, _check_scannet_file) for f in [path / "coord.npy", path / "color.npy",
                                                               path / "normal.npy"] + seg]
            elif name == "semantickitti":
                items.append((path, _kitti_points))
                if label is not None:
                    items.append((label, partial(_check_kitti_labels, bin_path=path)))
            else:
                items.append((path, _check_ply_file))
    if not items and not bad:
        bad.append((str(root), absent[0] if absent else f"{root} holds no {name} scenes"))

    def check(item: Tuple[Path, Callable[[Path], object]]) -> None:
        item[1](item[0])  # raises for a bad file

    return bad + check_files(items, check, lambda it: str(it[0]), progress, desc=f"check {root.name}")


# ----------------------------------------------------------------------------------------------------------------
# Voxelisation
# ----------------------------------------------------------------------------------------------------------------


def voxelize(coord: np.ndarray, grid_size: float, mode: str = "train", rng: Optional[np.random.Generator] = None
             ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One point per voxel of side ``grid_size`` (PTv3's GridSample): returns (grid_coord int32 (M, 3) =
    floor((coord − coord.min(0)) / grid_size) of the kept points, index (M,) of the point kept per voxel — in train
    mode a random point of each voxel drawn with ``rng``, in test mode the first — and inverse (N,) the voxel of
    every point). Voxels are ordered by their grid coordinates."""
    coord = np.asarray(coord)
    if coord.ndim != 2 or coord.shape[1] != 3 or coord.shape[0] == 0:
        raise ValueError(f"voxelize needs coordinates of shape (N ≥ 1, 3), got {coord.shape}")
    if not grid_size > 0:
        raise ValueError(f"grid_size must be positive, got {grid_size}")
    if mode not in ("train", "test"):
        raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
    c = coord.astype(np.float64)
    grid = np.floor((c - c.min(0)) / grid_size).astype(np.int64)
    dims = grid.max(0) + 1
    if float(dims[0]) * float(dims[1]) * float(dims[2]) >= 2.0 ** 62:
        raise ValueError(f"voxelize: {dims.tolist()} voxels per axis at grid_size {grid_size} is too many to index")
    key = (grid[:, 0] * dims[1] + grid[:, 1]) * dims[2] + grid[:, 2]
    order = np.argsort(key, kind="stable")
    _, start, inverse_sorted, count = np.unique(key[order], return_index=True, return_inverse=True,
                                                return_counts=True)
    if mode == "train":
        rng = np.random.default_rng() if rng is None else rng
        pick = start + np.minimum((rng.random(count.shape[0]) * count).astype(np.int64), count - 1)
    else:
        pick = start  # the stable sort keeps the first point of each voxel in front
    index = order[pick]
    inverse = np.empty(coord.shape[0], np.int64)
    inverse[order] = inverse_sorted.reshape(-1)
    return grid[index].astype(np.int32), index.astype(np.int64), inverse


# ----------------------------------------------------------------------------------------------------------------
# Augmentations
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class AugmentConfig:
    """PTv3's ScanNet training augmentations (Pointcept's semseg-pt-v3m1-0-base), in the order applied, with its
    defaults. A probability of 0 (or None for the ranges) switches one off; :meth:`off` switches all off.
    Angles are in units of π. The elastic distortion's noise grid covers the scene's extent at 0.2 m: fine for rooms,
    heavy for 100 m LiDAR scans (which is why :meth:`for_format` leaves it out for SemanticKITTI, as PTv3 does)."""

    center_shift: bool = True  # x, y centred, z minimum at 0
    dropout_ratio: float = 0.2  # share of points dropped …
    dropout_p: float = 0.2  # … with this probability
    rotate_z: Optional[Tuple[float, float]] = (-1.0, 1.0)  # about the origin (after the centre shift)
    rotate_z_p: float = 0.5
    rotate_xy: Optional[Tuple[float, float]] = (-1 / 64, 1 / 64)  # about x, then y, each about the box centre
    rotate_xy_p: float = 0.5
    scale: Optional[Tuple[float, float]] = (0.9, 1.1)  # isotropic
    flip_p: float = 0.5  # x and y, each on its own
    jitter_sigma: float = 0.005
    jitter_clip: float = 0.02
    elastic: Optional[Tuple[Tuple[float, float], ...]] = ((0.2, 0.4), (0.8, 1.6))  # (granularity, magnitude)
    elastic_p: float = 0.95
    auto_contrast_p: float = 0.2
    auto_contrast_blend: Optional[float] = None  # None → a random blend factor
    color_translate_p: float = 0.95
    color_translate_ratio: float = 0.05
    color_jitter_p: float = 0.95
    color_jitter_std: float = 0.05
    max_points: Optional[int] = 102400  # sphere crop around a random point
    center_after_crop: bool = True  # PTv3's final CenterShift(apply_z=False)

    @classmethod
    def off(cls, **overrides: object) -> "AugmentConfig":
        """Every augmentation switched off, then ``overrides`` applied (e.g. ``off(rotate_z_p=1.0)``)."""
        cfg = cls(center_shift=False, dropout_p=0.0, rotate_z_p=0.0, rotate_xy_p=0.0, scale=None, flip_p=0.0,
                  jitter_sigma=0.0, elastic=None, auto_contrast_p=0.0, color_translate_p=0.0, color_jitter_p=0.0,
                  max_points=None, center_after_crop=False)
        return replace(cfg, **overrides)  # type: ignore[arg-type]

    @classmethod
    def for_format(cls, format: str) -> "AugmentConfig":
        """PTv3's training augmentations for a format: ScanNet's for ``scannet`` / ``ply``; for ``semantickitti``
        (LiDAR, no colour) Pointcept's outdoor set: rotation about z, scale, flip and jitter only, no crop."""
        _format(format)
        if format != "semantickitti":
            return cls()
        return cls(center_shift=False, dropout_p=0.0, rotate_xy_p=0.0, elastic=None, auto_contrast_p=0.0,
                   color_translate_p=0.0, color_jitter_p=0.0, max_points=None, center_after_crop=False)

    def to_dict(self) -> Dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _rotation(axis: int, angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    if axis == 0:
        return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])
    if axis == 1:
        return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def _box_center(coord: np.ndarray) -> np.ndarray:
    return (coord.min(0) + coord.max(0)) / 2


def elastic_distortion(coord: np.ndarray, granularity: float, magnitude: float, rng: np.random.Generator
                       ) -> np.ndarray:
    """Displace points by a smooth random field: Gaussian noise on a grid of cell ``granularity`` metres, smoothed
    (two passes of a 3-cell box blur per axis, ≈ a Gaussian of 1.15 cells), interpolated trilinearly at the points
    and scaled by ``magnitude`` (the MinkowskiEngine / Pointcept ElasticDistortion)."""
    from scipy import ndimage
    from scipy.interpolate import RegularGridInterpolator

    lo = coord.min(0)
    dims = ((coord - lo).max(0) // granularity).astype(int) + 3
    noise = rng.standard_normal((*dims, 3)).astype(np.float32)
    for _ in range(2):
        for ax in range(3):
            noise = ndimage.uniform_filter1d(noise, 3, axis=ax, mode="constant", cval=0.0)
    axes = [np.linspace(lo[d] - granularity, lo[d] + granularity * (dims[d] - 2), dims[d]) for d in range(3)]
    interp = RegularGridInterpolator(axes, noise, bounds_error=False, fill_value=0.0)
    return coord + interp(coord) * magnitude


def augment(scene: Scene, rng: np.random.Generator, cfg: Optional[AugmentConfig] = None, format: str = "scannet"
            ) -> Scene:
    """A randomly augmented copy of ``scene`` (PTv3's training pipeline, all randomness from ``rng``): geometry
    moves coordinates (and normals, which rotate and flip with them; for ``semantickitti`` the x, y, z features
    follow the coordinates), colour augmentations update both ``color`` and the colour features, dropout and the
    final sphere crop remove points from every array. ``cfg`` None → :meth:`AugmentConfig.for_format`."""
    fmt = _format(format)
    cfg = AugmentConfig.for_format(format) if cfg is None else cfg
    coord = np.asarray(scene.coord, np.float64).copy()
    n = coord.shape[0]
    if scene.feat.shape != (n, fmt.in_channels):
        raise ValueError(f"scene {scene.name}: features have shape {scene.feat.shape}; the {fmt.name} format has "
                         f"({n}, {fmt.in_channels}) ({fmt.feature_desc})")
    feat = np.asarray(scene.feat, np.float32)
    seg = None if scene.segment is None else np.asarray(scene.segment).copy()
    normal: Optional[np.ndarray] = None
    color: Optional[np.ndarray] = None
    extra: Optional[np.ndarray] = None  # feature columns carried along unchanged
    if fmt.has_color:
        normal = feat[:, 3:6].astype(np.float64)
        if scene.color is not None:
            color = _check_color(scene.color, n, f"scene {scene.name}").astype(np.float64)
        else:
            extra = feat[:, :3].copy()  # no colours to augment: keep the colour features as they are
    else:
        extra = feat[:, 3:].copy()

    def keep(idx: np.ndarray) -> None:
        nonlocal coord, normal, color, extra, seg
        coord = coord[idx]
        normal = None if normal is None else normal[idx]
        color = None if color is None else color[idx]
        extra = None if extra is None else extra[idx]
        seg = None if seg is None else seg[idx]

    def rotate(R: np.ndarray, center: np.ndarray) -> None:
        nonlocal coord, normal
        coord = (coord - center) @ R.T + center
        if normal is not None:
            normal = normal @ R.T

    if cfg.center_shift:
        lo, hi = coord.min(0), coord.max(0)
        coord -= np.array([(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2, lo[2]])
    if cfg.dropout_p > 0 and rng.random() < cfg.dropout_p:
        m = max(1, int(coord.shape[0] * (1 - cfg.dropout_ratio)))
        keep(np.sort(rng.choice(coord.shape[0], m, replace=False)))
    if cfg.rotate_z is not None and cfg.rotate_z_p > 0 and rng.random() < cfg.rotate_z_p:
        rotate(_rotation(2, rng.uniform(*cfg.rotate_z) * math.pi), np.zeros(3))
    if cfg.rotate_xy is not None and cfg.rotate_xy_p > 0:
        for axis in (0, 1):
            if rng.random() < cfg.rotate_xy_p:
                rotate(_rotation(axis, rng.uniform(*cfg.rotate_xy) * math.pi), _box_center(coord))
    if cfg.scale is not None:
        coord *= rng.uniform(*cfg.scale)
    if cfg.flip_p > 0:
        for axis in (0, 1):
            if rng.random() < cfg.flip_p:
                coord[:, axis] = -coord[:, axis]
                if normal is not None:
                    normal[:, axis] = -normal[:, axis]
    if cfg.jitter_sigma > 0:
        coord += np.clip(cfg.jitter_sigma * rng.standard_normal(coord.shape), -cfg.jitter_clip, cfg.jitter_clip)
    if cfg.elastic and cfg.elastic_p > 0 and rng.random() < cfg.elastic_p:
        for granularity, magnitude in cfg.elastic:
            coord = elastic_distortion(coord, granularity, magnitude, rng)
    if color is not None:
        color = _augment_color(color, cfg, rng)
    if cfg.max_points is not None and coord.shape[0] > cfg.max_points:
        center = coord[rng.integers(coord.shape[0])]
        d2 = np.square(coord - center).sum(1)
        keep(np.sort(np.argpartition(d2, cfg.max_points - 1)[:cfg.max_points]))
    if cfg.center_after_crop:
        lo, hi = coord.min(0), coord.max(0)
        coord -= np.array([(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2, 0.0])
    return _augmented_scene(scene.name, fmt, coord, normal, color, extra, seg)


def _augment_color(color: np.ndarray, cfg: AugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """:func:`augment`'s colour steps on (n, 3) colours in [0, 255] (float64): auto-contrast, a random translation
    of every channel, per-point jitter, each with its probability; a new array."""
    if cfg.auto_contrast_p > 0 and rng.random() < cfg.auto_contrast_p:
        lo, hi = color.min(0, keepdims=True), color.max(0, keepdims=True)
        contrast = (color - lo) * (255.0 / np.maximum(hi - lo, 1e-6))
        blend = rng.random() if cfg.auto_contrast_blend is None else cfg.auto_contrast_blend
        color = (1 - blend) * color + blend * contrast
    if cfg.color_translate_p > 0 and rng.random() < cfg.color_translate_p:
        shift = (rng.random((1, 3)) - 0.5) * 255 * 2 * cfg.color_translate_ratio
        color = np.clip(color + shift, 0, 255)
    if cfg.color_jitter_p > 0 and rng.random() < cfg.color_jitter_p:
        color = np.clip(color + rng.standard_normal(color.shape) * cfg.color_jitter_std * 255, 0, 255)
    return color


def _augmented_scene(name: str, fmt: PointFormat, coord: np.ndarray, normal: Optional[np.ndarray],
                     color: Optional[np.ndarray], extra: Optional[np.ndarray], seg: Optional[np.ndarray]) -> Scene:
    """The Scene :func:`augment` returns, its features rebuilt in the format's layout (``fmt``): rounded colours
    (or the colour features carried along) and normals, or the coordinates and the other feature columns."""
    coord32 = coord.astype(np.float32)
    color8 = None
    if fmt.has_color:
        if color is not None:
            color8 = np.clip(np.rint(color), 0, 255).astype(np.uint8)
            rgb = color8.astype(np.float32) / 255.0
        else:
            rgb = extra
        new_feat = np.concatenate([rgb, normal], 1)  # type: ignore[list-item]
    else:
        new_feat = np.concatenate([coord32, extra], 1)  # type: ignore[list-item]
    return Scene(name, coord32, new_feat.astype(np.float32), seg, color8)


Batch = Dict[str, Any]


def collate(scenes: Sequence[Scene], grid_size: float, mode: str = "train",
            rngs: Optional[Sequence[np.random.Generator]] = None) -> Batch:
    """Voxelise each scene (train: a random point per voxel, drawn with the scene's generator in ``rngs``; test: the
    first) and concatenate them in PTv3's layout:
    feat (N, C), grid (N, 3) int64, offset (B,) running counts, segment (N,) or None, and for mapping predictions back
    ``inverse`` (the voxel of every original point, per scene) and ``points`` (original point counts)."""
    feats, grids, segs, inverses, counts, points = [], [], [], [], [], []
    for i, s in enumerate(scenes):
        grid, index, inverse = voxelize(s.coord, grid_size, mode, None if rngs is None else rngs[i])
        feats.append(torch.from_numpy(np.ascontiguousarray(s.feat[index], dtype=np.float32)))
        grids.append(torch.from_numpy(grid.astype(np.int64)))
        segs.append(None if s.segment is None else torch.from_numpy(s.segment[index].astype(np.int64)))
        inverses.append(torch.from_numpy(inverse.astype(np.int64)))
        counts.append(len(index))
        points.append(len(s.coord))
    segment = None if any(x is None for x in segs) else torch.cat(segs)
    return {"feat": torch.cat(feats), "grid": torch.cat(grids), "offset": torch.tensor(counts).cumsum(0),
            "segment": segment, "inverse": inverses, "points": points, "voxels": sum(counts)}
