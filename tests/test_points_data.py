"""3-D point clouds: the ScanNet / SemanticKITTI / .ply loaders and their errors, voxelisation, PTv3's augmentations
and the synthetic rooms, all on tiny data written here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

from polymixer.experiments.points import synth as points_synth
from polymixer.experiments.points.data import (
    FORMATS, SCANNET20_CLASSES, AugmentConfig, PointDataset, Scene, augment, detect_format, load_ply,
    load_scannet_scene, load_semantickitti_scan, voxelize, write_ply,
)
from polymixer.experiments.points.synth import default_data, make_room, resolve_data, write_synthetic_rooms


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def write_scannet_scene(folder: Path, n: int = 50, seed: int = 0, labels: bool = True, fname: str = "segment20.npy",
                        **override: np.ndarray) -> Path:
    rng = np.random.default_rng(seed)
    arrays = {"coord": rng.uniform(0, 3, (n, 3)).astype(np.float32),
              "color": rng.integers(0, 256, (n, 3)).astype(np.uint8),
              "normal": unit(rng.standard_normal((n, 3)))}
    if labels:
        arrays[fname[:-4]] = rng.integers(-1, 20, n).astype(np.int64)
    arrays.update(override)
    folder.mkdir(parents=True, exist_ok=True)
    for k, v in arrays.items():
        np.save(folder / f"{k}.npy", v)
    return folder


def write_kitti_scan(root: Path, seq: str, frame: str, n: int = 40, seed: int = 0, raw: Optional[np.ndarray] = None,
                     labels: bool = True) -> Path:
    rng = np.random.default_rng(seed)
    velo, lab = root / "sequences" / seq / "velodyne", root / "sequences" / seq / "labels"
    velo.mkdir(parents=True, exist_ok=True)
    pts = np.concatenate([rng.uniform(-20, 20, (n, 3)), rng.uniform(0, 1, (n, 1))], 1).astype(np.float32)
    pts.tofile(velo / f"{frame}.bin")
    if labels:
        lab.mkdir(parents=True, exist_ok=True)
        raw = rng.choice([0, 10, 40, 50, 70, 252], n).astype(np.uint32) if raw is None else raw
        raw.astype(np.uint32).tofile(lab / f"{frame}.label")
    return velo / f"{frame}.bin"


def toy_scene(n: int = 400, seed: int = 0) -> Scene:
    rng = np.random.default_rng(seed)
    coord = rng.uniform(0, 4, (n, 3)).astype(np.float32)
    color = rng.integers(0, 256, (n, 3)).astype(np.uint8)
    normal = unit(rng.standard_normal((n, 3)))
    feat = np.concatenate([color / 255.0, normal], 1).astype(np.float32)
    return Scene("toy", coord, feat, rng.integers(-1, 20, n).astype(np.int64), color)


# ----------------------------------------------------------------------------------------------------------------
# Loaders
# ----------------------------------------------------------------------------------------------------------------


def test_scannet_layout(tmp_path):
    root = tmp_path / "scannet"
    write_scannet_scene(root / "train" / "scene0000_00", seed=1)
    write_scannet_scene(root / "train" / "scene0001_00", seed=2, fname="segment.npy")
    write_scannet_scene(root / "val" / "scene0002_00", seed=3)
    write_scannet_scene(root / "test" / "scene0003_00", seed=4, labels=False)
    assert detect_format(root) == "scannet"

    s = load_scannet_scene(root / "train" / "scene0000_00")
    assert s.name == "scene0000_00" and s.coord.dtype == np.float32 and s.coord.shape == (50, 3)
    color = np.load(root / "train" / "scene0000_00" / "color.npy")
    normal = np.load(root / "train" / "scene0000_00" / "normal.npy")
    np.testing.assert_allclose(s.feat, np.concatenate([color / 255.0, normal], 1), rtol=1e-6)
    np.testing.assert_array_equal(s.segment, np.load(root / "train" / "scene0000_00" / "segment20.npy"))
    np.testing.assert_array_equal(s.color, color)
    assert s.feat.shape[1] == FORMATS["scannet"].in_channels

    train = PointDataset(root, "train")
    assert train.format.name == "scannet" and train.names == ["scene0000_00", "scene0001_00"] and len(train) == 2
    assert train[1].segment is not None  # segment.npy fallback
    a = train[0]
    a.coord[:] = 0  # callers may modify what they get; the cache keeps its own copy
    assert np.abs(train[0].coord).sum() > 0
    assert PointDataset(root, "test", format="scannet")[0].segment is None
    with pytest.raises(FileNotFoundError):
        PointDataset(tmp_path / "scannet2", "train", format="scannet")


def test_semantickitti_learning_map(tmp_path):
    root = tmp_path / "kitti"
    raw = np.array([10, 40, 0, 252, 1, 99, 81, 13, 60, 72], np.uint32)
    inst = np.arange(10, dtype=np.uint32) * 7 + 3
    b = write_kitti_scan(root, "00", "000000", n=10, raw=raw | (inst << 16))
    s = load_semantickitti_scan(b, root / "sequences" / "00" / "labels" / "000000.label")
    assert s.name == "00/000000"
    np.testing.assert_array_equal(s.segment, [0, 8, -1, 0, -1, -1, 18, 4, 8, 16])
    pts = np.fromfile(b, np.float32).reshape(-1, 4)
    np.testing.assert_array_equal(s.feat, pts)
    np.testing.assert_array_equal(s.coord, pts[:, :3])
    assert s.color is None and load_semantickitti_scan(b).segment is None

    write_kitti_scan(root, "01", "000000", seed=1)
    write_kitti_scan(root, "08", "000007", seed=2)
    write_kitti_scan(root, "11", "000001", seed=3, labels=False)
    assert detect_format(root) == "semantickitti"
    train = PointDataset(root, "train")
    assert train.names == ["00/000000", "01/000000"] and train.format.in_channels == 4
    assert PointDataset(root, "val")[0].name == "08/000007"
    assert PointDataset(root, "test")[0].segment is None


def test_ply_round_trip(tmp_path):
    from plyfile import PlyData, PlyElement

    s = toy_scene(60)
    path = tmp_path / "plys" / "train" / "a.ply"
    write_ply(path, s.coord, s.color, s.segment)
    back = load_ply(path)
    np.testing.assert_array_equal(back.coord, s.coord)
    np.testing.assert_array_equal(back.color, s.color)
    np.testing.assert_array_equal(back.segment, s.segment)
    np.testing.assert_allclose(back.feat[:, :3], s.color / 255.0, rtol=1e-6)
    assert (back.feat[:, 3:] == 0).all()  # no normals in the file → zeros
    assert detect_format(tmp_path / "plys") == "ply"
    ds = PointDataset(tmp_path / "plys", "train")
    assert ds.names == ["a"] and ds[0].segment is not None

    # normals, a float scalar_label, no colour
    v = np.empty(5, [("x", "f4"), ("y", "f4"), ("z", "f4"), ("nx", "f4"), ("ny", "f4"), ("nz", "f4"),
                     ("scalar_label", "f4")])
    for k in ("x", "y", "z"):
        v[k] = np.arange(5)
    v["nx"], v["ny"], v["nz"] = 0, 0, 1
    v["scalar_label"] = [0, 1, 2, -1, 19]
    p2 = tmp_path / "b.ply"
    PlyData([PlyElement.describe(v, "vertex")], text=True).write(str(p2))
    b = load_ply(p2)
    assert b.color is None and (b.feat[:, :3] == 0).all() and (b.feat[:, 5] == 1).all()
    np.testing.assert_array_equal(b.segment, [0, 1, 2, -1, 19])
    write_ply(tmp_path / "c.ply", s.coord, None)
    assert load_ply(tmp_path / "c.ply").segment is None


# ----------------------------------------------------------------------------------------------------------------
# Bad inputs: a ValueError naming the file
# ----------------------------------------------------------------------------------------------------------------


def _bad_scannet(tmp_path: Path, case: str) -> Path:
    n = 30
    over = {
        "lengths": {"color": np.zeros((n - 1, 3), np.uint8)},
        "nan": {"coord": np.full((n, 3), np.nan, np.float32)},
        "inf": {"coord": np.concatenate([np.zeros((n - 1, 3)), [[np.inf, 0, 0]]]).astype(np.float32)},
        "label_high": {"segment20": np.full(n, 20, np.int64)},
        "label_low": {"segment20": np.full(n, -2, np.int64)},
        "empty": {"coord": np.zeros((0, 3), np.float32), "color": np.zeros((0, 3), np.uint8),
                  "normal": np.zeros((0, 3), np.float32), "segment20": np.zeros(0, np.int64)},
        "shape": {"coord": np.zeros((n, 2), np.float32)},
        "normal_len": {"normal": np.zeros((n + 1, 3), np.float32)},
        "label_len": {"segment20": np.zeros(n + 2, np.int64)},
    }[case]
    return write_scannet_scene(tmp_path / "scene0000_00", n=n, **over)


@pytest.mark.parametrize("case", ["lengths", "nan", "inf", "label_high", "label_low", "empty", "shape",
                                  "normal_len", "label_len"])
def test_bad_scannet(tmp_path, case):
    folder = _bad_scannet(tmp_path, case)
    with pytest.raises(ValueError, match=str(folder)):
        load_scannet_scene(folder)


def test_bad_scannet_missing_file(tmp_path):
    folder = write_scannet_scene(tmp_path / "scene0000_00")
    (folder / "normal.npy").unlink()
    with pytest.raises(FileNotFoundError, match="normal.npy"):
        load_scannet_scene(folder)


def test_bad_semantickitti(tmp_path):
    b = write_kitti_scan(tmp_path, "00", "000000", n=10)
    lab = tmp_path / "sequences" / "00" / "labels" / "000000.label"
    with open(b, "ab") as f:
        f.write(b"\0" * 5)
    with pytest.raises(ValueError, match=r"000000\.bin.*multiple of 16"):
        load_semantickitti_scan(b)
    b = write_kitti_scan(tmp_path, "00", "000000", n=10)
    np.zeros(9, np.uint32).tofile(lab)
    with pytest.raises(ValueError, match=r"000000\.label.*lengths differ"):
        load_semantickitti_scan(b, lab)
    np.full(10, 7, np.uint32).tofile(lab)  # 7 is no SemanticKITTI class
    with pytest.raises(ValueError, match=r"000000\.label.*learning map"):
        load_semantickitti_scan(b, lab)
    pts = np.zeros((10, 4), np.float32)
    pts[3, 1] = np.nan
    pts.tofile(b)
    with pytest.raises(ValueError, match=r"000000\.bin.*NaN"):
        load_semantickitti_scan(b)
    np.zeros((0, 4), np.float32).tofile(b)
    with pytest.raises(ValueError, match=r"000000\.bin.*empty"):
        load_semantickitti_scan(b)
    with pytest.raises(FileNotFoundError, match="000001.bin"):
        load_semantickitti_scan(b.with_name("000001.bin"))


def test_bad_ply(tmp_path):
    s = toy_scene(20)
    p = tmp_path / "bad.ply"
    write_ply(p, s.coord, s.color, np.full(20, 25))
    with pytest.raises(ValueError, match=r"bad\.ply.*outside"):
        load_ply(p)
    coord = s.coord.copy()
    coord[0, 0] = np.nan
    write_ply(p, coord, s.color)
    with pytest.raises(ValueError, match=r"bad\.ply.*NaN"):
        load_ply(p)
    write_ply(p, np.zeros((0, 3), np.float32), None)
    with pytest.raises(ValueError, match=r"bad\.ply.*empty"):
        load_ply(p)
    p.write_bytes(b"not a ply file")
    with pytest.raises(ValueError, match=r"bad\.ply"):
        load_ply(p)


def test_detect_format_errors(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path / "nothing")):
        detect_format(tmp_path / "nothing")
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"empty.*coord\.npy"):
        detect_format(tmp_path / "empty")


# ----------------------------------------------------------------------------------------------------------------
# Voxelisation
# ----------------------------------------------------------------------------------------------------------------


def test_voxelize():
    rng = np.random.default_rng(0)
    coord = (rng.uniform(-1, 1, (3000, 3)) * [1, 2, 0.5] + 10).astype(np.float32)
    g = 0.1
    grid, index, inverse = voxelize(coord, g, "train", np.random.default_rng(1))
    own = np.floor((coord.astype(np.float64) - coord.min(0)) / g).astype(np.int64)
    assert grid.dtype == np.int32 and grid.min() >= 0 and len(grid) == len(index)
    np.testing.assert_array_equal(grid[inverse], own)  # every point's voxel contains it
    np.testing.assert_array_equal(inverse[index], np.arange(len(index)))  # one kept point per voxel, in its voxel
    assert len(np.unique(own, axis=0)) == len(index)
    again = voxelize(coord, g, "train", np.random.default_rng(1))
    np.testing.assert_array_equal(again[1], index)
    other = voxelize(coord, g, "train", np.random.default_rng(2))
    assert (other[1] != index).any() and (other[2] == inverse).all()
    _, first, inv = voxelize(coord, g, "test")
    np.testing.assert_array_equal(first, voxelize(coord, g, "test")[1])
    expect = np.full(len(first), len(coord))
    np.minimum.at(expect, inv, np.arange(len(coord)))
    np.testing.assert_array_equal(first, expect)  # test mode keeps the first point of each voxel
    with pytest.raises(ValueError):
        voxelize(coord[:, :2], g)


# ----------------------------------------------------------------------------------------------------------------
# Augmentations
# ----------------------------------------------------------------------------------------------------------------


def _same(a: Scene, b: Scene) -> None:
    np.testing.assert_array_equal(a.coord, b.coord)
    np.testing.assert_array_equal(a.feat, b.feat)
    np.testing.assert_array_equal(a.segment, b.segment)
    np.testing.assert_array_equal(a.color, b.color)


def test_augment_reproducible_and_consistent():
    s = toy_scene(2000)
    cfg = AugmentConfig(dropout_p=1.0, max_points=1000, auto_contrast_p=1.0)
    a = augment(s, np.random.default_rng(5), cfg)
    _same(a, augment(s, np.random.default_rng(5), cfg))
    assert not np.array_equal(a.coord, augment(s, np.random.default_rng(6), cfg).coord)
    assert len(a.coord) == len(a.feat) == len(a.segment) == len(a.color) == 1000
    assert a.coord.dtype == a.feat.dtype == np.float32 and a.color.dtype == np.uint8
    np.testing.assert_allclose(a.feat[:, :3], a.color / 255.0, rtol=1e-6)  # colour features follow the colours
    np.testing.assert_allclose(np.linalg.norm(a.feat[:, 3:], axis=1), 1, atol=1e-5)  # normals stay unit
    orig = np.bincount(s.segment + 1, minlength=21)
    assert (np.bincount(a.segment + 1, minlength=21) <= orig).all()  # points only dropped, labels untouched
    np.testing.assert_array_equal(s.coord, toy_scene(2000).coord)  # the input is left alone
    for seed in range(6):  # the defaults (random dropout) keep the arrays consistent too
        d = augment(s, np.random.default_rng(seed))
        assert len(d.coord) == len(d.feat) == len(d.segment) == len(d.color) <= 2000


def test_augment_rotation_keeps_shape():
    s = toy_scene(50)
    for seed in range(4):
        cfg = AugmentConfig.off(rotate_z_p=1.0, rotate_xy_p=1.0, scale=(0.9, 1.1))
        a = augment(s, np.random.default_rng(seed), cfg)
        d0 = np.linalg.norm(s.coord[:, None] - s.coord[None], axis=-1)
        d1 = np.linalg.norm(a.coord[:, None] - a.coord[None], axis=-1)
        ratio = d1[d0 > 0] / d0[d0 > 0]
        assert ratio.std() < 1e-4 and 0.9 - 1e-4 <= ratio.mean() <= 1.1 + 1e-4
        # normals turned with the coordinates: the angle between a normal and a displacement is kept
        dots0 = (s.feat[1:, 3:] * (s.coord[1:] - s.coord[0])).sum(1) / d0[0, 1:]
        dots1 = (a.feat[1:, 3:] * (a.coord[1:] - a.coord[0])).sum(1) / d1[0, 1:]
        np.testing.assert_allclose(dots0, dots1, atol=1e-4)
    f = augment(s, np.random.default_rng(0), AugmentConfig.off(flip_p=1.0))
    np.testing.assert_allclose(f.coord[:, :2], -s.coord[:, :2])
    np.testing.assert_allclose(f.feat[:, 3:5], -s.feat[:, 3:5])
    _same(augment(s, np.random.default_rng(0), AugmentConfig.off()), s)


def test_augment_crop_elastic_and_kitti():
    s = toy_scene(3000)
    a = augment(s, np.random.default_rng(0), AugmentConfig.off(max_points=500))
    assert len(a.coord) == 500
    kept = {tuple(p) for p in a.coord.tolist()}
    assert kept <= {tuple(p) for p in s.coord.tolist()}
    assert len(augment(s, np.random.default_rng(0), AugmentConfig.off(max_points=10_000)).coord) == 3000
    e = augment(s, np.random.default_rng(0), AugmentConfig.off(elastic_p=1.0, elastic=((0.2, 0.4), (0.8, 1.6))))
    shift = np.linalg.norm(e.coord - s.coord, axis=1)
    assert 0 < shift.mean() < 0.5
    c = augment(s, np.random.default_rng(0), AugmentConfig.off(center_shift=True))
    assert abs(c.coord[:, 2].min()) < 1e-6 and np.allclose(c.coord[:, :2].min(0), -c.coord[:, :2].max(0), atol=1e-5)

    rng = np.random.default_rng(1)
    coord = rng.uniform(-30, 30, (800, 3)).astype(np.float32)
    k = Scene("00/000000", coord, np.concatenate([coord, rng.random((800, 1))], 1).astype(np.float32),
              rng.integers(-1, 19, 800))
    crop = AugmentConfig.for_format("semantickitti")
    crop.max_points = 300
    for cfg in (None, crop, AugmentConfig.off(rotate_z_p=1.0, dropout_p=1.0)):
        out = augment(k, np.random.default_rng(2), cfg, format="semantickitti")
        np.testing.assert_array_equal(out.feat[:, :3], out.coord)  # x, y, z features follow the coordinates
        assert out.color is None and len(out.feat) == len(out.segment)
        assert set(out.feat[:, 3].tolist()) <= set(k.feat[:, 3].tolist())
    with pytest.raises(ValueError, match="features"):
        augment(k, np.random.default_rng(0), format="scannet")


# ----------------------------------------------------------------------------------------------------------------
# Synthetic rooms
# ----------------------------------------------------------------------------------------------------------------

TINY = dict(train=2, val=1, test=1, points=3000)


@pytest.fixture(scope="module")
def rooms(tmp_path_factory) -> Path:
    return write_synthetic_rooms(tmp_path_factory.mktemp("synth") / "rooms", seed=0, progress=False, **TINY)


def test_synthetic_layout(rooms):
    assert detect_format(rooms) == "scannet"
    meta = json.loads((rooms / "meta.json").read_text())
    assert meta["seed"] == 0 and meta["rooms"] == {"train": 2, "val": 1, "test": 1}
    assert meta["class_names"] == list(SCANNET20_CLASSES)
    names = {s: PointDataset(rooms, s).names for s in ("train", "val", "test")}
    assert names == {"train": ["scene0000_00", "scene0001_00"], "val": ["scene0002_00"], "test": ["scene0003_00"]}
    labels, walls, chairs = [], [], []
    for split in ("train", "val", "test"):
        for scene in PointDataset(rooms, split):
            assert scene.coord.shape == (3000, 3) and scene.color.dtype == np.uint8 and scene.segment is not None
            np.testing.assert_allclose(np.linalg.norm(scene.feat[:, 3:], axis=1), 1, atol=1e-5)
            labels.append(scene.segment)
            walls.append(scene.color[scene.segment == 0].mean(0))
            if (scene.segment == 4).sum() >= 10:
                chairs.append(scene.color[scene.segment == 4].mean(0))
    seg = np.concatenate(labels)
    assert len(np.unique(seg[seg >= 0])) >= 8 and (seg == -1).any()
    # colours are drawn per object, not per class: the same class looks different from room to room
    assert np.ptp(np.array(walls), 0).max() > 20
    assert len(chairs) >= 2 and np.ptp(np.array(chairs), 0).max() > 10


def test_synthetic_deterministic(rooms, tmp_path):
    again = write_synthetic_rooms(tmp_path / "again", seed=0, progress=False, **TINY)
    other = write_synthetic_rooms(tmp_path / "other", seed=1, progress=False, **TINY)
    for f in ("coord", "color", "normal", "segment20"):
        a = np.load(rooms / "train" / "scene0000_00" / f"{f}.npy")
        np.testing.assert_array_equal(a, np.load(again / "train" / "scene0000_00" / f"{f}.npy"))
    assert not np.array_equal(np.load(rooms / "val" / "scene0002_00" / "coord.npy"),
                              np.load(other / "val" / "scene0002_00" / "coord.npy"))
    x = make_room(np.random.default_rng(3), 500, "bathroom")
    y = make_room(np.random.default_rng(3), 500, "bathroom")
    for a, b in zip(x, y):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(FileExistsError):
        write_synthetic_rooms(again, progress=False, **TINY)


def test_default_data_and_resolve(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYMIXER_CACHE", str(tmp_path / "cache"))
    sizes = dict(train=1, val=1, test=0, points=500)
    root = default_data(seed=2, progress=False, **sizes)
    assert root.parent == tmp_path / "cache" / "points" and (root / "meta.json").is_file()
    assert default_data(seed=2, progress=False, **sizes) == root  # reused

    def racing(root, **kw):  # another process publishes the folder first
        Path(root).mkdir(parents=True)
        raise FileExistsError(root)

    monkeypatch.setattr(points_synth, "write_synthetic_rooms", racing)
    assert default_data(seed=3, progress=False, **sizes).is_dir()
    assert resolve_data(str(root)) == root
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        resolve_data(str(tmp_path / "no-such-folder"))
