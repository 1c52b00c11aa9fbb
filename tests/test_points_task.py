"""3-D segmentation task: loss, training, evaluation through the voxels, the commands and the bench (tiny rooms)."""

import json

import numpy as np
import pytest
import torch
from conftest import torchrun

from polymixer.experiments.cli import main
from polymixer.experiments.points.data import PointDataset
from polymixer.experiments.points.synth import write_synthetic_rooms
from polymixer.models import create_model
from polymixer.experiments.points.data import collate
from polymixer.experiments.points.task import PointTask, evaluate_points, lovasz_softmax, predict_scene
from polymixer.checkpoint import load_weights, resolve_checkpoint
from polymixer.experiments.train.loop import TrainConfig, configure_optimizer

TOY = dict(enc_depths=(1, 1, 1), enc_channels=(8, 16, 16), enc_heads=(1, 2, 2), dec_depths=(1, 1),
           dec_channels=(8, 16), dec_heads=(1, 2), patch_size=64, drop_path=0.0)


@pytest.fixture(scope="module")
def rooms(tmp_path_factory):
    return write_synthetic_rooms(tmp_path_factory.mktemp("rooms") / "rooms", train=2, val=1, test=1, points=2500,
                                 seed=3, progress=False)


def test_lovasz_softmax_is_zero_when_perfect_and_positive_otherwise():
    labels = torch.tensor([0, 1, 2, 2, -1])
    perfect = torch.nn.functional.one_hot(labels.clamp(min=0), 3).float() * 50
    assert float(lovasz_softmax(perfect, labels)) == pytest.approx(0.0, abs=1e-6)
    wrong = perfect.roll(1, dims=1).requires_grad_(True)
    loss = lovasz_softmax(wrong, labels)
    assert float(loss.detach()) > 0.9
    loss.backward()
    assert wrong.grad[-1].abs().sum() == 0  # the ignored point takes no part


def test_lovasz_matches_one_minus_iou_for_hard_predictions():
    torch.manual_seed(0)
    labels = torch.randint(0, 3, (40,))
    pred = torch.where(torch.rand(40) < 0.7, labels, torch.randint(0, 3, (40,)))
    logits = torch.nn.functional.one_hot(pred, 3).float() * 100
    ious = []
    for c in labels.unique().tolist():
        inter = ((pred == c) & (labels == c)).sum()
        union = ((pred == c) | (labels == c)).sum()
        ious.append(float(inter / union))
    assert float(lovasz_softmax(logits, labels)) == pytest.approx(1 - np.mean(ious), abs=1e-4)


def test_predictions_reach_every_original_point(rooms):
    scene = PointDataset(rooms, "val")[0]
    model = create_model("tiny-ptv3", **TOY).eval()
    (pred,), _, voxels = predict_scene(model, [scene], 0.02)
    assert pred.shape == (len(scene.coord),)
    b = collate([scene], 0.02, "test")
    with torch.no_grad():
        vox = model(b["feat"], b["grid"], b["offset"]).argmax(-1).numpy()
    assert np.array_equal(pred, vox[b["inverse"][0].numpy()]) and voxels == len(vox)
    # points of one voxel share its prediction
    grid = np.floor((scene.coord - scene.coord.min(0)) / 0.02).astype(np.int64)
    _, first = np.unique(grid, axis=0, return_inverse=True)
    first = first.reshape(-1)
    for v in np.unique(first)[:50]:
        assert len(set(pred[first == v].tolist())) == 1


def test_training_steps_lower_the_loss(rooms):
    torch.manual_seed(0)
    model = create_model("tiny-ppomv3", **TOY, num_classes=20)
    ds = PointDataset(rooms, "train")
    task = PointTask(ds, PointDataset(rooms, "val"), batch_size=2, seed=0)
    batch = task.batch(0, 0, 1, torch.device("cpu"))
    assert batch["offset"].tolist()[-1] == batch["feat"].shape[0] == batch["segment"].shape[0]
    opt = configure_optimizer(model, TrainConfig(lr=3e-3, weight_decay=0.0))
    for g in opt.param_groups:
        g["lr"] = 3e-3 * g["lr_scale"]
    losses = []
    for _ in range(6):
        loss = task.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    # batches are a pure function of the step
    again = task.batch(0, 0, 1, torch.device("cpu"))
    assert torch.equal(again["feat"], batch["feat"]) and torch.equal(again["grid"], batch["grid"])


def test_evaluation_counts_every_point(rooms):
    model = create_model("tiny-ptv3", **TOY)
    ds = PointDataset(rooms, "test")
    m = evaluate_points(model, ds)
    labelled = sum(int((ds[i].segment >= 0).sum()) for i in range(len(ds)))
    assert m["counted"] == labelled and m["points"] == sum(len(ds[i].coord) for i in range(len(ds)))
    assert 0 <= m["miou"] <= 1 and 0 <= m["oa"] <= 1 and m["mpts_per_s"] > 0


def test_train_eval_segment_commands_and_checkpoint_round_trip(rooms, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "points", "--preset", "tiny-ppomv3-hybrid", "--data", str(rooms), "--steps", "2", "--batch-size",
            "2", "--eval-every", "2", "--ckpt-every", "2", "--out", str(run), "--quiet", "--warmup", "1"]
    assert main(args) == 0
    ck = resolve_checkpoint(run)
    cfg = json.loads((ck / "config.json").read_text())
    assert cfg["family"] == "points" and cfg["data"]["format"] == "scannet"
    # the weights load back into a fresh model bit for bit
    from polymixer.experiments.points.task import load_segmenter

    model, _ = load_segmenter(run)
    fresh = create_model("tiny-ppomv3-hybrid")
    load_weights(fresh, ck)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    capsys.readouterr()
    assert main(["eval", "points", "--ckpt", str(run), "--scenes", "1"]) == 0  # the first labelled split: test
    captured = capsys.readouterr()
    out = captured.out
    assert "evaluating the test split" in captured.err
    assert '"miou"' in out and "IoU %" in out and (run / "eval_test_scene0.png").is_file()
    scene_dir = next((rooms / "test").iterdir())
    seg = tmp_path / "seg"
    assert main(["segment3d", "--ckpt", str(run), str(scene_dir), "--out", str(seg)]) == 0
    labels = np.load(seg / f"{scene_dir.name}_labels.npy")
    assert labels.shape == (len(np.load(scene_dir / "coord.npy")),)
    assert (seg / f"{scene_dir.name}_labels.ply").is_file() and (seg / f"{scene_dir.name}.png").is_file()


def test_segment3d_names_a_bad_scene(rooms, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "3d", "--preset", "tiny-ptv3", "--data", str(rooms), "--steps", "1", "--batch-size", "1",
                 "--out", str(run), "--quiet", "--warmup", "1"]) == 0
    bad = tmp_path / "scene_bad"
    bad.mkdir()
    np.save(bad / "coord.npy", np.full((5, 3), np.nan, dtype=np.float32))
    np.save(bad / "color.npy", np.zeros((5, 3), dtype=np.uint8))
    np.save(bad / "normal.npy", np.zeros((5, 3), dtype=np.float32))
    capsys.readouterr()
    assert main(["segment3d", "--ckpt", str(run), str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "coord.npy" in capsys.readouterr().err


def test_bench_points_runs_every_part(rooms, tmp_path):
    """Every part on toy models; the quality part sweeps PPoMv3 over the learning-rate grid (--lrs runs a subset; a
    run trained to the end is only evaluated again), picks its best rate by validation mIoU, and trains its variant at
    that rate."""
    from dataclasses import replace

    from polymixer.experiments.bench.common import sweep_folder
    from polymixer.experiments.points.bench import PointBenchConfig, report, run

    cfg = PointBenchConfig(presets=("ptv3", "ppomv3"), sizes=(600,), patch_models=("ppomv3+pom_patch_size=scene",),
                           patch_scene=600, repeats=1, conv_points=600, conv_channels=(4,),
                           quality_models=("tiny-ptv3", "tiny-ppomv3", "tiny-ppomv3+pom_patch_size=scene"),
                           sweep=("tiny-ppomv3",), lrs=(6e-3,), quality_steps=2, quality_batch=1, quality_points=1500,
                           data_dir=str(rooms), model_overrides=TOY, bracket=0, out=str(tmp_path / "bench"))
    payload = run(cfg, progress=False)
    text = report(payload)
    assert "PPoMv3 ÷ PTv3 at 600 voxels" in text and "whole scene" in text and "tiny PPoMv3" in text
    assert {r["spec"] for r in payload["speed"]["rows"]} >= {"ptv3", "ppomv3", "ppomv3+pom_patch_size=scene"}
    assert payload["conv"]["rows"][0]["speedup"] > 0
    assert (tmp_path / "bench" / "points.png").is_file()
    q = payload["quality"]["rows"]
    assert [(r["spec"], r["lr"]) for r in q] == [(s, 6e-3) for s in cfg.quality_models]  # --lrs: one rate
    assert all(0 <= r["val_miou"] <= 1 and 0 <= r["miou"] <= 1 for r in q)
    # the sweep: PPoMv3 at every rate, its finished run kept (same scores and time), the variant at PPoMv3's best rate
    quality = tmp_path / "bench" / "quality"
    ckpt = next((quality / "tiny-ppomv3").rglob("model.safetensors"))
    stamp = ckpt.stat().st_mtime_ns
    swept = run(replace(cfg, parts=("quality",), lrs=()), progress=False)
    assert ckpt.stat().st_mtime_ns == stamp and swept["speed"] == payload["speed"]
    sq = swept["quality"]
    assert sq["grid"] == [3e-3, 6e-3, 1.2e-2] and sq["selected_by"] == "val_miou"
    pom = [r for r in sq["rows"] if r["spec"] == "tiny-ppomv3"]
    assert [r["lr"] for r in pom] == [3e-3, 6e-3, 1.2e-2] and all(r["rates"] == 3 for r in pom)
    assert (quality / "tiny-ppomv3-lr0.003").is_dir() and (quality / "tiny-ppomv3-lr0.012").is_dir()
    best = [r for r in pom if r["best_lr"]]
    assert len(best) == 1 and best[0]["val_miou"] == max(r["val_miou"] for r in pom)
    lr = best[0]["lr"]
    variant = {r["lr"]: r for r in sq["rows"] if r["spec"] == "tiny-ppomv3+pom_patch_size=scene"}
    assert variant[lr]["lr_from"] == "best tiny-ppomv3" and set(variant) <= {6e-3, lr}
    assert sweep_folder(quality, "tiny-ppomv3_pom_patch_size-scene", lr, 6e-3).is_dir()
    assert [r["lr"] for r in sq["rows"] if r["spec"] == "tiny-ptv3"] == [6e-3]  # not swept
    again = {(r["spec"], r["lr"]): (r["miou"], r["train_min"]) for r in sq["rows"]}
    assert all(again[(r["spec"], r["lr"])] == (r["miou"], r["train_min"]) for r in q)
    text = report(swept)
    assert "best lr" in text and "val mIoU % at lr →" in text and "test mIoU % at lr →" in text and "*" in text
    assert "point clouds: best without full attention within 1 point: " in text
    # a process running part of the sweep for another model keeps the picture model's picture
    def pictures() -> dict:
        return {f.name: f.read_bytes() for f in (tmp_path / "bench").glob("points_scene*.png")}

    drawn = pictures()
    assert "points_scene.png" in drawn and swept["quality"]["pictures"]["scene"].startswith("points_scene")
    part = run(replace(cfg, parts=("quality",), quality_models=("tiny-ptv3",), sweep=("tiny-ppomv3", "tiny-ptv3"),
                       lrs=(3e-3,)), progress=False)
    assert any(r["spec"] == "tiny-ptv3" and r["lr"] == 3e-3 for r in part["quality"]["rows"])  # it trained
    assert pictures() == drawn and part["quality"]["pictures"] == swept["quality"]["pictures"]


def test_picture_owner_never_replaces_another_models_picture():
    from polymixer.experiments.bench.common import picture_owner

    assert picture_owner("b", ("a", "b"), drawn_before=True) == "b"
    assert picture_owner("b", ("a", "c"), drawn_before=False) == "c"  # nothing drawn yet: the last model
    assert picture_owner("b", ("a", "c"), drawn_before=True) is None
    assert picture_owner("b", (), drawn_before=False) is None


DDP_SCRIPT = """
import sys, torch
from polymixer.experiments.points.task import train_points
from polymixer.experiments.train.loop import TrainConfig
cfg = TrainConfig(steps=2, batch_size=2, lr=1e-3, warmup=1, eval_every=100, ckpt_every=100, out=sys.argv[1] + "/run",
                  progress=False, seed=5)
toy = dict(enc_depths=(1, 1, 2), enc_channels=(8, 16, 16), enc_heads=(1, 2, 2), dec_depths=(1, 1),
           dec_channels=(8, 16), dec_heads=(1, 2), patch_size=64, drop_path=0.0)
res = train_points("tiny-ppomv3-hybrid", cfg, sys.argv[2], progress=False, **toy, pom_patch_size=None)
flat = torch.cat([p.detach().flatten() for p in res["model"].parameters()])
torch.save(flat, f"{sys.argv[1]}/params_rank{res['rank']}_of_{res['world']}.pt")
"""


def test_ddp_two_processes_stay_in_sync(rooms, tmp_path):
    """torchrun with 2 CPU processes (gloo): each rank trains on its share of the scenes, the ranks stay equal."""
    torchrun(DDP_SCRIPT, [tmp_path, rooms], tmp_path, 2, name="ddp_3d.py", timeout=300)
    r0 = torch.load(tmp_path / "params_rank0_of_2.pt")
    r1 = torch.load(tmp_path / "params_rank1_of_2.pt")
    assert torch.equal(r0, r1), "the two ranks drifted apart"


def test_evaluation_defaults_to_the_first_labelled_split(rooms, tmp_path):
    """ScanNet's test scenes carry no labels and SemanticKITTI's test scans neither: the default is then val."""
    import shutil

    from polymixer.experiments.points.data import labelled_split

    assert labelled_split(rooms) == "test"
    copy = tmp_path / "unlabelled"
    shutil.copytree(rooms, copy)
    for scene in (copy / "test").iterdir():
        (scene / "segment20.npy").unlink(missing_ok=True)
        (scene / "segment.npy").unlink(missing_ok=True)
    assert labelled_split(copy) == "val"
    shutil.rmtree(copy / "test")
    assert labelled_split(copy) == "val"
