"""Satellite time series: the PASTIS layout and its errors, folds, dates, normalisation, windows, batching, the
synthetic generator, segmentation metrics, the task on the shared loop (one step, checkpoint round-trip with the
band statistics) and the commands."""

from __future__ import annotations

import datetime as dt
import inspect
import json
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import pytest
import torch

from polymixer.experiments.cli import main as cli
from polymixer.experiments.eo.data import (
    VOID, PastisSplit, band_stats, collate, compute_band_stats, day_of_year, fold_splits, parse_date, read_metadata,
    windows,
)
from polymixer.experiments.eo.synth import (
    END, PARCEL_COUNTS, START, TILES, make_patch, make_tile, write_synthetic_pastis,
)
from polymixer.experiments.metrics import ConfusionMatrix
from polymixer.models import create_model
from polymixer.experiments.eo.task import EOTask, load_segmenter, masked_cross_entropy, predict_patch, train_eo
from polymixer.checkpoint import load_model
from polymixer.experiments.train.loop import TrainConfig

TOY = dict(dim=16, heads=2, temporal_depth=1, spatial_depth=1, sel_heads=2)


def write_pastis(root: Path, frames: Sequence[int] = (4, 3, 5, 2, 4, 3), size: int = 16,
                 folds: Optional[Sequence[int]] = None, string_dates: bool = False) -> Path:
    """A small dataset in the PASTIS layout: one patch per entry of ``frames`` (its number of dates), folds 1–5
    cyclically; the first patch's dates are listed out of order (its frames follow the listing)."""
    (root / "DATA_S2").mkdir(parents=True)
    (root / "ANNOTATIONS").mkdir()
    rng = np.random.default_rng(0)
    features = []
    for k, T in enumerate(frames):
        pid = 100 + k
        days = sorted(rng.choice(np.arange(0, 365, 7), T, replace=False).tolist())
        if k == 0:
            days = days[::-1]
        dates = {str(i): int((dt.date(2019, 1, 1) + dt.timedelta(days=d)).strftime("%Y%m%d"))
                 for i, d in enumerate(days)}
        data = (rng.integers(0, 3000, (T, 10, size, size)) + 1000 * np.array(days)[:, None, None, None] // 365)
        np.save(root / "DATA_S2" / f"S2_{pid}.npy", data.astype(np.int16))
        target = rng.integers(0, 20, (3, size, size)).astype(np.uint8)
        np.save(root / "ANNOTATIONS" / f"TARGET_{pid}.npy", target)
        fold = (folds[k] if folds is not None else 1 + k % 5)
        features.append({"type": "Feature", "geometry": None,
                          "properties": {"ID_PATCH": pid, "Fold": fold, "N_Parcel": 3, "Patch_Cover": 0.5,
                                         "dates-S2": json.dumps(dates) if string_dates else dates}})
    (root / "metadata.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    return root


@pytest.fixture
def pastis(tmp_path) -> Path:
    return write_pastis(tmp_path / "pastis")


# -- layout, folds, dates -------------------------------------------------------------------------------------------


def test_reads_the_pastis_layout(pastis):
    recs = read_metadata(pastis)
    assert [r.patch_id for r in recs] == [100, 101, 102, 103, 104, 105]
    assert [r.fold for r in recs] == [1, 2, 3, 4, 5, 1]
    split = PastisSplit(pastis, (1, 2, 3))
    assert [r.patch_id for r in split.records] == [100, 101, 102, 105]
    x, doy, y = split.sample(0)
    assert x.shape == (4, 16, 16, 10) and x.dtype == np.float32 and y.shape == (16, 16) and y.dtype == np.int64
    assert list(doy) == sorted(doy)  # frames sorted by date although the metadata lists them backwards
    raw = np.load(pastis / "DATA_S2" / "S2_100.npy")
    np.testing.assert_array_equal(x, raw[::-1].transpose(0, 2, 3, 1).astype(np.float32))
    np.testing.assert_array_equal(y, np.load(pastis / "ANNOTATIONS" / "TARGET_100.npy")[0])
    # a window, normalised, and the first frames only with max_frames
    stats = compute_band_stats(split)
    xw, _, yw = split.sample(0, 4, 8, 8, stats)
    np.testing.assert_allclose(xw, stats.normalise(x[:, 4:12, 8:16], axis=-1), rtol=1e-6)
    np.testing.assert_array_equal(yw, y[4:12, 8:16])
    short = PastisSplit(pastis, (1,), max_frames=2)
    assert short.sample(0)[0].shape[0] == 2 and list(short.doy(0)) == list(doy[:2])
    # dates may also be stored as a JSON string (as geopandas writes them)
    other = write_pastis(pastis.parent / "strings", string_dates=True)
    assert [r.dates for r in read_metadata(other)] == [r.dates for r in recs]


def test_folds_dates_and_windows(pastis):
    assert fold_splits(1) == {"train": (1, 2, 3), "val": (4,), "test": (5,)}
    assert fold_splits(4) == {"train": (4, 5, 1), "val": (2,), "test": (3,)}
    with pytest.raises(ValueError, match="fold must be 1 … 5"):
        fold_splits(6)
    assert parse_date(20180924) == parse_date("2018-09-24") == dt.date(2018, 9, 24)
    assert day_of_year(dt.date(2019, 1, 1)) == 0 and day_of_year(dt.date(2019, 12, 31)) == 364
    assert day_of_year(dt.date(2020, 12, 31)) == 365
    split = PastisSplit(pastis, (1,))
    assert windows(split, 8) == [(0, 0, 0), (0, 0, 8), (0, 8, 0), (0, 8, 8), (1, 0, 0), (1, 0, 8), (1, 8, 0),
                                 (1, 8, 8)]
    assert windows(split, None) == [(0, 0, 0), (1, 0, 0)]
    split.sizes = [(128, 128)]  # a PASTIS patch: 25 windows of 24, row-major, the last 8 pixels dropped
    w = windows(split, 24)
    assert len(w) == 25 and w[1] == (0, 0, 24) and w[5] == (0, 24, 0) and w[-1] == (0, 96, 96)


def test_bad_inputs_name_the_file(pastis, tmp_path):
    with pytest.raises(FileNotFoundError, match="metadata.geojson not found"):
        read_metadata(tmp_path)
    meta_path = pastis / "metadata.geojson"
    meta = json.loads(meta_path.read_text())

    def rewrite(change) -> None:
        m = json.loads(json.dumps(meta))
        change(m)
        meta_path.write_text(json.dumps(m))

    meta_path.write_text("{not json")
    with pytest.raises(ValueError, match="metadata.geojson is not JSON"):
        read_metadata(pastis)
    rewrite(lambda m: m["features"][2]["properties"].pop("dates-S2"))
    with pytest.raises(ValueError, match="metadata.geojson: feature 2 lacks dates-S2"):
        read_metadata(pastis)
    rewrite(lambda m: m["features"][1]["properties"]["dates-S2"].update({"1": "2019-02-30"}))
    with pytest.raises(ValueError, match="metadata.geojson: patch 101, dates-S2: '2019-02-30' is not a date"):
        read_metadata(pastis)
    rewrite(lambda m: None)
    with pytest.raises(ValueError, match="metadata.geojson has no patch in fold 5"):
        PastisSplit(pastis, (5,), records=[r for r in read_metadata(pastis) if r.fold != 5])
    np.save(pastis / "DATA_S2" / "S2_101.npy", np.zeros((3, 9, 16, 16), np.int16))
    with pytest.raises(ValueError, match=r"S2_101.npy has shape \(3, 9, 16, 16\); expected \(T, 10, H, W\)"):
        PastisSplit(pastis, (2,))
    np.save(pastis / "DATA_S2" / "S2_101.npy", np.zeros((2, 10, 16, 16), np.int16))
    with pytest.raises(ValueError, match="S2_101.npy .* T = 3 .*patch 101"):
        PastisSplit(pastis, (2,))
    np.save(pastis / "DATA_S2" / "S2_101.npy", np.zeros((3, 10, 16, 16), np.int16))
    np.save(pastis / "ANNOTATIONS" / "TARGET_101.npy", np.zeros((3, 16, 15), np.uint8))
    with pytest.raises(ValueError, match=r"TARGET_101.npy has shape \(3, 16, 15\)"):
        PastisSplit(pastis, (2,))
    np.save(pastis / "ANNOTATIONS" / "TARGET_101.npy", np.full((1, 16, 16), 25, np.uint8))
    with pytest.raises(ValueError, match="TARGET_101.npy holds class 25"):
        PastisSplit(pastis, (2,)).labels(0)
    (pastis / "DATA_S2" / "S2_101.npy").unlink()
    with pytest.raises(ValueError, match="S2_101.npy not found"):  # a SampleError: a bad sample, skippable
        PastisSplit(pastis, (2,))


def test_band_statistics(pastis):
    split = PastisSplit(pastis, (1, 2, 3))
    data = np.concatenate([np.load(r.s2_path).transpose(1, 0, 2, 3).reshape(10, -1) for r in split.records], 1)
    exact = compute_band_stats(split, stride=1)
    np.testing.assert_allclose(exact.mean, data.mean(1), rtol=1e-9)
    np.testing.assert_allclose(exact.std, data.std(1), rtol=1e-9)
    assert band_stats(split).source.startswith("computed")  # no NORM_S2_patch.json
    norm = {f"Fold_{f}": {"mean": [float(f)] * 10, "std": [f + 1.0] * 10} for f in range(1, 6)}
    (pastis / "NORM_S2_patch.json").write_text(json.dumps(norm))
    stats = band_stats(split)
    assert stats.mean == (2.0,) * 10 and stats.std == (3.0,) * 10  # the mean over the training folds 1, 2, 3
    assert band_stats(split, "tsvit").mean[0] == pytest.approx(1165.94, abs=0.01)
    assert band_stats(split, "computed").source.startswith("computed")
    np.testing.assert_allclose(stats.normalise(np.full((2, 10), 5.0), axis=1), np.ones((2, 10)))


def test_collate_pads_and_masks():
    a = (np.ones((3, 4, 4, 10), np.float32), np.array([5, 9, 20]), np.zeros((4, 4), np.int64))
    b = (np.full((1, 4, 4, 10), 2, np.float32), np.array([7]), np.ones((4, 4), np.int64))
    x, doy, mask, labels = collate([a, b])
    assert x.shape == (2, 3, 4, 4, 10) and doy.tolist() == [[5, 9, 20], [7, 0, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False]] and (x[1, 1:] == 0).all()
    assert labels.shape == (2, 4, 4) and labels.dtype == torch.int64


def test_synthetic_generator(tmp_path):
    root = write_synthetic_pastis(tmp_path / "synth", patches_per_fold=2, size=24, frames=(3, 5), progress=False)
    recs = read_metadata(root)
    split = PastisSplit(root, (1, 2, 3, 4, 5), records=recs)
    assert len(split) == 10 and set(split.sizes) == {(24, 24)}
    labels = np.stack([split.labels(i) for i in range(10)])
    assert (labels == 0).any() and ((labels > 0) & (labels < VOID)).any() and labels.max() <= VOID
    meta = json.loads((root / "metadata.geojson").read_text())["features"]
    tiles = [f["properties"]["TILE"] for f in meta]
    assert tiles == [TILES[0]] * 5 + [TILES[1]] * 5  # patch k in tile (k // 5) % 4: every fold has every tile
    by_tile = {t: {r.dates for r, name in zip(recs, tiles) if name == t} for t in set(tiles)}
    assert all(len(dates) == 1 for dates in by_tile.values())  # one set of dates per tile
    assert [len(next(iter(by_tile[t]))) for t in TILES[:2]] == [3, 4]
    assert all(START <= d <= END for r in recs for d in r.dates)
    assert band_stats(split).source.startswith("NORM_S2_patch.json")
    with pytest.raises(FileExistsError):
        write_synthetic_pastis(root, patches_per_fold=1, size=24, progress=False)
    tile = make_tile(0, 2, (3, 5))
    a, b = (make_patch(np.random.default_rng([0, 3]), tile, 24) for _ in range(2))
    np.testing.assert_array_equal(a["s2"], b["s2"])  # a patch is a pure function of (seed, index) and its tile
    np.testing.assert_array_equal(a["classes"], b["classes"])
    assert make_tile(0, 2, (3, 5)).dates == tile.dates != make_tile(1, 2, (3, 5)).dates
    with pytest.raises(ValueError, match="0 ≤ cloudy ≤ 1"):
        write_synthetic_pastis(tmp_path / "bad", cloudy=1.5, progress=False)


@pytest.fixture(scope="module")
def stand_in():
    """44 patches of the default stand-in (24 × 24 pixels, 38–61 dates): 32 of tile 0, 4 of each other tile."""
    tiles = [make_tile(0, j) for j in range(4)]
    return {j: [make_patch(np.random.default_rng([0, 100 * j + k]), tiles[j]) for k in range(32 if j == 0 else 4)]
            for j in range(4)}, tiles


def test_stand_in_follows_pastis_statistics(stand_in):
    patches, tiles = stand_in
    # dates: 38–61 per tile (PASTIS's range), on the 5-day revisit grid, between September 2018 and November 2019
    assert [len(t.dates) for t in tiles] == [38, 46, 53, 61]
    for t in tiles:
        days = t.days.astype(int)
        assert START <= t.dates[0] and t.dates[-1] <= END and len(set(days % 5)) == 1
    assert len({t.dates for t in tiles}) == 4  # each tile its own dates
    # clouds: the share of cloudy pixel-dates (blue band far above any clear surface) near the 30% asked for
    blue = np.concatenate([p["s2"][:, 0].ravel() for ps in patches.values() for p in ps])
    assert 0.22 <= float(np.mean(blue > 2500)) <= 0.38
    # classes: labelled crop parcels as skewed as PASTIS's (meadow first; its four largest classes most parcels)
    counts = np.zeros(VOID + 1)
    for p in (p for ps in patches.values() for p in ps):
        for cell in np.unique(p["parcels"]):
            c = int(p["classes"][p["parcels"] == cell][0])
            counts[c] += 0 < c < VOID
    crops = counts[1:VOID]
    assert crops.argmax() == 0 and crops[[0, 1, 2, 7]].sum() >= 0.5 * crops.sum()
    rank = lambda v: np.argsort(np.argsort(v))  # noqa: E731
    assert np.corrcoef(rank(crops), rank(np.array(PARCEL_COUNTS)))[0, 1] >= 0.6  # Spearman's rank correlation
    # the default writes at least 300 training patches (3 folds of 5)
    assert 3 * inspect.signature(write_synthetic_pastis).parameters["patches_per_fold"].default >= 300


def _nearest_mean(train_x, train_y, test_x, test_y) -> Tuple[float, float]:
    """(overall, balanced) accuracy of the nearest class mean on standardised features."""
    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    classes = np.unique(train_y)
    means = np.stack([((train_x[train_y == c] - mu) / sd).mean(0) for c in classes])
    z = (test_x - mu) / sd
    pred = classes[(np.square(z[:, None]) - 2 * z[:, None] * means[None] + np.square(means[None])).sum(-1).argmin(1)]
    balanced = np.mean([np.mean(pred[test_y == c] == c) for c in np.unique(test_y)])
    return float(np.mean(pred == test_y)), float(balanced)


def test_stand_in_needs_the_time_profile_not_a_yearly_mean(stand_in):
    """Per pixel, the nearest class mean over the time-averaged bands is clearly worse than over the whole profile
    (the 38 dates of tile 0 × 10 bands, clouds included), and clearly better than chance: the classes differ by their
    seasons, and their spectra help."""
    patches = stand_in[0][0]
    x = np.stack([p["s2"] for p in patches]).astype(np.float32).transpose(0, 3, 4, 1, 2)  # (N, S, S, T, C)
    y = np.stack([p["classes"] for p in patches])
    keep = y != VOID
    train = np.zeros_like(keep)
    train[:22] = True
    scores = {}
    for name, feat in (("mean", x.mean(3)), ("profile", x.reshape(x.shape[:3] + (-1,)))):
        scores[name] = _nearest_mean(feat[train & keep], y[train & keep], feat[~train & keep], y[~train & keep])
    chance = 1 / len(np.unique(y[~train & keep]))
    # balanced accuracy (the mean over classes of their recall: background is 40% of the pixels)
    assert scores["mean"][1] > 2 * chance  # the spectra alone carry something …
    assert scores["profile"][1] >= scores["mean"][1] + 0.15  # … the seasons much more
    assert scores["profile"][0] >= scores["mean"][0] + 0.05


# -- metrics --------------------------------------------------------------------------------------------------------


def test_confusion_matrix_hand_made():
    cm = ConfusionMatrix(4, ignore_index=9, class_names=["bg", "a", "b", "c"])
    truth = torch.tensor([[0, 0, 1, 1], [1, 2, 9, 9]])
    pred = torch.tensor([[0, 1, 1, 1], [2, 2, 3, 0]])
    cm.update(pred, truth)
    expected = np.zeros((4, 4), np.int64)
    for t, p in ((0, 0), (0, 1), (1, 1), (1, 1), (1, 2), (2, 2)):  # the void pixels are not counted
        expected[t, p] += 1
    np.testing.assert_array_equal(cm.matrix, expected)
    assert cm.overall_accuracy == pytest.approx(4 / 6)
    # IoU: bg 1/(2+0)=1/2, a 2/(3+1)=1/2, b 1/(1+1)=1/2, c absent from truth and prediction → excluded
    np.testing.assert_allclose(cm.iou[:3], [0.5, 0.5, 0.5])
    assert np.isnan(cm.iou[3]) and cm.miou == pytest.approx(0.5)
    d = cm.as_dict()
    assert d["classes_present"] == 3 and d["per_class"][3]["iou"] is None and d["per_class"][1]["support"] == 3
    # a class predicted but absent from the truth counts, with IoU 0
    cm.update(np.array([3]), np.array([0]))
    assert cm.iou[3] == 0.0 and cm.miou == pytest.approx((1 / 3 + 0.5 + 0.5 + 0) / 4)
    with pytest.raises(ValueError, match="target holds class 5, outside 0 … 3 or the void label 9"):
        cm.update(torch.tensor([0]), torch.tensor([5]))
    with pytest.raises(ValueError, match="is one of the 4 classes"):
        ConfusionMatrix(4, ignore_index=2)
    with pytest.raises(TypeError, match="integer class ids"):
        cm.update(torch.zeros(2), torch.zeros(2, dtype=torch.long))


def test_masked_cross_entropy_ignores_void():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 3, 3)
    labels = torch.randint(0, 5, (2, 3, 3))
    labels[0, 0] = VOID
    valid = labels != VOID
    ref = torch.nn.functional.cross_entropy(logits.permute(0, 2, 3, 1)[valid], labels[valid])
    torch.testing.assert_close(masked_cross_entropy(logits, labels), ref)
    changed = logits.clone()
    changed[0, :, 0] = 100.0  # logits on void pixels do not matter
    torch.testing.assert_close(masked_cross_entropy(changed, labels), ref)
    assert masked_cross_entropy(logits, torch.full_like(labels, VOID)) == 0


# -- the task on the shared loop ------------------------------------------------------------------------------------


def test_batches_are_a_pure_function_of_step_and_shard(pastis):
    split = PastisSplit(pastis, (1, 2, 3))
    task = EOTask(split, split, compute_band_stats(split), 4, seed=3, crop=8)
    a, b = task.batch(5, 0, 1, torch.device("cpu")), task.batch(5, 0, 1, torch.device("cpu"))
    assert torch.equal(a["x"], b["x"]) and torch.equal(a["labels"], b["labels"])
    halves = [task.batch(5, s, 2, torch.device("cpu")) for s in (0, 1)]
    assert torch.equal(torch.cat([h["labels"] for h in halves]), a["labels"])
    for h, rows in zip(halves, (slice(0, 2), slice(2, 4))):  # each share pads to its own longest series
        T = h["x"].shape[1]
        torch.testing.assert_close(h["x"], a["x"][rows, :T])
        assert not a["mask"][rows, T:].any()
    assert a["x"].shape[2:] == (8, 8, 10) and a["pixels"] == 4 * 64


def test_flips_move_bands_and_labels_together():
    from polymixer.experiments.eo.task import _flip

    y = np.arange(16).reshape(4, 4)
    x = np.stack([y, -y], -1)[None].repeat(2, 0)  # (T, H, W, C) whose bands equal ± the label
    seen = set()
    for k in range(8):
        a, b = _flip(x, y, k)
        np.testing.assert_array_equal(a[1, ..., 0], b)
        np.testing.assert_array_equal(a[0, ..., 1], -b)
        seen.add(b.tobytes())
    assert len(seen) == 8  # the 8 symmetries of the square
    a, b = _flip(x[:, :3], y[:3], 1)  # a rectangle keeps its shape
    assert a.shape == (2, 3, 4, 2) and b.shape == (3, 4)


def test_one_step_lowers_the_loss(pastis):
    torch.manual_seed(0)
    split = PastisSplit(pastis, (1, 2, 3))
    task = EOTask(split, split, compute_band_stats(split), 4, seed=0, crop=8, augment=False)
    model = create_model("tiny-tsvipom-hybrid", image_size=8, **TOY)
    batch = task.batch(0, 0, 1, torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    first = task.loss(model, batch)
    for _ in range(3):
        opt.zero_grad()
        task.loss(model, batch).backward()
        opt.step()
    assert task.loss(model, batch) < first


def test_predict_patch_by_windows_covers_every_pixel():
    class PerPixel(torch.nn.Module):
        """Logits that depend on each pixel's own values only: windows must agree with the whole patch."""

        config = type("C", (), {"num_classes": 3})

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(10, 3))

        def forward(self, x, doy, mask=None):
            return torch.einsum("bthwc,ck->bkhw", x, self.w)

    model = PerPixel()
    x, doy = torch.randn(3, 20, 28, 10), torch.arange(3)
    whole = predict_patch(model, x, doy)
    torch.testing.assert_close(predict_patch(model, x, doy, window=8, batch=5), whole)
    torch.testing.assert_close(predict_patch(model, x, doy, window=40), whole)
    torch.testing.assert_close(predict_patch(model, x, doy, window=24), whole)  # the 20-pixel side taken whole


def _tcfg(tmp_path, **kw) -> TrainConfig:
    base = dict(steps=2, batch_size=4, lr=3e-3, warmup=1, eval_every=2, ckpt_every=2, out=str(tmp_path / "run"),
                progress=False)
    return TrainConfig(**{**base, **kw})


def test_train_checkpoint_round_trip_and_commands(pastis, tmp_path, capsys):
    torch.manual_seed(0)
    (pastis / "NORM_S2_patch.json").write_text(json.dumps(
        {f"Fold_{f}": {"mean": [1000.0 + f] * 10, "std": [900.0 + f] * 10} for f in range(1, 6)}))
    res = train_eo("tiny-tsvipom", _tcfg(tmp_path, ema=0.9), str(pastis), fold=1, crop=8, progress=False, **TOY)
    assert {"loss", "oa", "miou"} <= set(res["metrics"])
    run = tmp_path / "run"
    model, stats, cfg = load_segmenter(run)
    assert stats == res["stats"] and stats.mean == (1002.0,) * 10  # folds 1–3 of NORM_S2_patch.json
    assert cfg["data"]["fold"] == 1 and cfg["model"]["image_size"] == 8 and not model.training
    x, doy = torch.randn(1, 3, 16, 16, 10), torch.tensor([[3, 50, 200]])
    raw, _, _ = load_segmenter(run, ema=False)
    with torch.no_grad():
        torch.testing.assert_close(raw(x, doy), res["model"].eval()(x, doy))
        ema = load_model(run, family="eo", ema=True).eval()
        torch.testing.assert_close(model(x, doy), ema(x, doy))  # the EMA weights by default when present
    # the commands
    capsys.readouterr()
    assert cli(["eval", "eo", "--ckpt", str(run), "--tiles", "1", "--png", str(tmp_path / "e"),
                "--json", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[:out.index("\n}") + 2])
    assert summary["split"] == "test" and summary["folds"] == [5] and summary["window"] == 8
    assert 0 <= summary["oa"] <= 1 and summary["km2_per_s"] > 0 and summary["pixels"] == 16 * 16
    assert "IoU %" in out and "Soft winter wheat" in out
    assert (tmp_path / "e_confusion.png").stat().st_size > 5000 and (tmp_path / "e_tiles.png").stat().st_size > 5000
    assert json.loads((tmp_path / "m.json").read_text())["matrix"]
    assert cli(["eval", "eo", "--ckpt", str(run), "--window", "0", "--tiles", "0", "--png", str(tmp_path / "w")]) == 0
    assert '"window": "whole patches"' in capsys.readouterr().out
    assert cli(["segment", "--ckpt", str(run), "--data", str(pastis), "--patch", "104", "101",
                "--out", str(tmp_path / "seg")]) == 0
    classes = np.load(tmp_path / "seg" / "104_classes.npy")
    assert classes.shape == (16, 16) and classes.dtype == np.uint8 and classes.max() < 19
    assert (tmp_path / "seg" / "101_classes.png").is_file()
    assert cli(["segment", "--ckpt", str(run), "--data", str(pastis), "--patch", "999"]) == 2
    assert "no patch 999" in capsys.readouterr().err
    # a resumed run keeps the statistics its weights were trained with, whatever the folder says now
    (pastis / "NORM_S2_patch.json").write_text(json.dumps(
        {f"Fold_{f}": {"mean": [7.0] * 10, "std": [3.0] * 10} for f in range(1, 6)}))
    again = train_eo("tiny-tsvipom", _tcfg(tmp_path, steps=3, ema=0.9), str(pastis), crop=8, progress=False, **TOY)
    assert again["stats"] == stats and load_segmenter(run)[1] == stats
    # resuming with another model or on other data refuses; a bad fold is reported
    with pytest.raises(ValueError, match="holds a run trained on .*pastis, not .*other"):
        train_eo("tiny-tsvipom", _tcfg(tmp_path, steps=3), str(write_pastis(tmp_path / "other")), crop=8,
                 progress=False, **TOY)
    with pytest.raises(ValueError, match="model config differs"):
        train_eo("tiny-tsvit", _tcfg(tmp_path, steps=3), str(pastis), crop=8, progress=False, **TOY)
    with pytest.raises(SystemExit) as bad:  # the parser refuses it, one line, before anything is read or written
        cli(["train", "eo", "--data", str(pastis), "--fold", "7", "--out", str(tmp_path / "x"), "--quiet"])
    assert bad.value.code == 2 and "--fold: invalid choice: 7 (choose from 1, 2, 3, 4, 5)" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
