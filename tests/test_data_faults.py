"""Data faults: an unreadable or malformed sample stops a run with its file's name (after a checkpoint of the last
completed step when the loop meets it), or, with --skip-bad-samples, is skipped, counted and listed; every family's
loader reports it the same way."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from polymixer.experiments.cli import main
from polymixer.experiments.data.faults import SampleError, SampleFaults, reading
from polymixer.checkpoint import load_trainer_state, load_weights, resolve_checkpoint, verify_checkpoint
from polymixer.experiments.train.loop import TrainConfig, train


def _fail(exc):
    def f():
        raise exc
    return f


def test_the_policy_stops_by_default_and_skips_on_request():
    with pytest.raises(SampleError, match=r"^x\.bin: boom$"):
        SampleFaults().call("x.bin", _fail(ValueError("boom")))
    with pytest.raises(SampleError, match=r"x\.bin: boom \(--skip-bad-samples skips such samples"):
        SampleFaults.training(False).call("x.bin", _fail(OSError("boom")))
    with pytest.raises(KeyError):  # a programming error is not a bad sample
        SampleFaults(skip=True).call("x.bin", _fail(KeyError("k")))
    f = SampleFaults(skip=True)
    assert f.call("x.bin", _fail(EOFError("cut"))) is None and f.call("x.bin", _fail(EOFError("cut"))) is None
    assert len(f) == 1 and f.unreported() == [("x.bin", "cut")] and f.unreported() == []
    f.restore({"y.bin": "old"})
    assert list(f.bad) == ["x.bin", "y.bin"] and f.unreported() == []

    def load(j):
        if j in (1, 2):
            raise SampleError(f"s{j}", "bad")
        return j

    assert f.pick(1, 5, load) == 3 and f.pick(4, 5, load) == 4 and f.pick(2, 5, load) == 3
    with pytest.raises(SampleError, match="s1: bad"):
        SampleFaults().pick(1, 5, load)
    with pytest.raises(ValueError, match="all 2 training samples are unreadable"):
        SampleFaults(skip=True).pick(0, 2, lambda j: load(j + 1))


class FileTask:
    """A toy regression task reading one .npy file per sample at batch time (a lazy loader); at step ``break_at``
    file 2 is truncated, as a failing disk would."""

    unit = "ex"

    def __init__(self, files, skip, break_at=None):
        self.files, self.break_at = files, break_at
        self.faults = SampleFaults.training(skip)

    def _load(self, j):
        with reading(self.files[j]):
            return torch.from_numpy(np.load(self.files[j])).float()

    def batch(self, step, share, shares, device):
        if step == self.break_at:
            self.files[2].write_bytes(self.files[2].read_bytes()[:20])
        picks = np.random.default_rng([0, step]).integers(0, len(self.files), 4)
        x = torch.stack([self.faults.pick(int(p), len(self.files), self._load) for p in picks])
        return x[:, :4], x[:, 4:]

    def count(self, batch):
        return 4

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    def evaluate(self, model, step, out_dir):
        return {}


def _files(folder):
    folder.mkdir()
    rng = np.random.default_rng(0)
    out = []
    for k in range(5):
        np.save(folder / f"s{k}.npy", rng.normal(size=5))
        out.append(folder / f"s{k}.npy")
    return out


def _cfg(out, skip=False):
    return TrainConfig(steps=12, batch_size=4, lr=1e-2, warmup=1, eval_every=100, ckpt_every=100, log_every=1,
                       out=str(out), progress=False, skip_bad_samples=skip)


def _fit(task, cfg):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, train(model, task, cfg, {"family": "toy", "model": {}})


def test_a_bad_sample_met_in_training_stops_after_a_checkpoint_and_resumes_skipping_it(tmp_path):
    files = _files(tmp_path / "a")
    with pytest.raises(SampleError) as err:
        _fit(FileTask(files, skip=False, break_at=5), _cfg(tmp_path / "cut"))
    text = str(err.value)
    m = re.search(r"stopped before step (\d+); the checkpoint of step (\d+)", text)
    assert m and int(m.group(1)) == int(m.group(2)) + 1 >= 6, text
    assert "s2.npy" in text and "--skip-bad-samples" in text
    ck = resolve_checkpoint(tmp_path / "cut")  # written when the bad sample was met (ckpt_every is 100)
    assert ck.name == f"step_{int(m.group(2)):08d}" and verify_checkpoint(ck) is None

    # the same run resumed with --skip-bad-samples ends where a run that skipped from the start ends
    model, res = _fit(FileTask(files, skip=True), _cfg(tmp_path / "cut", skip=True))
    ref_files = _files(tmp_path / "b")
    ref, _ = _fit(FileTask(ref_files, skip=True, break_at=5), _cfg(tmp_path / "ref", skip=True))
    for k, v in ref.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    bad = json.loads((tmp_path / "cut" / "bad_samples.json").read_text())
    assert list(bad) == [str(files[2])]
    assert load_trainer_state(tmp_path / "cut")["bad_samples"] == bad
    assert res["history"][-1]["bad_samples"] == 1 and res["history"][-1]["step"] == 12


def test_images_stop_naming_the_file_or_skip_it(tmp_path, capsys, polymixer_cache):
    from polymixer.experiments.image.data import image_folder

    root = tmp_path / "imgs"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((12, 12), 40 * i + (100 if c == "b" else 0), np.uint8)).save(root / c / f"{i}.png")
    (root / "b" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    with pytest.raises(SampleError, match=r"b/1\.png"):
        image_folder(root, 8, 1)
    f = SampleFaults(skip=True)
    data = image_folder(root, 8, 1, f)
    assert len(data.labels) == 5 and data.labels.tolist() == [0, 0, 0, 1, 1] and list(f.bad) == [str(root / "b/1.png")]

    cmd = ["train", "image", "--preset", "tiny-sit", "--data", str(root), "--image-size", "8", "--steps", "2",
           "--batch-size", "4", "--eval-samples", "0", "--eval-every", "100", "--out", str(tmp_path / "run"),
           "--quiet"]
    assert main(cmd) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "b/1.png" in err and "--skip-bad-samples" in err, err
    assert main(cmd + ["--no-data-check"]) == 2  # the loader itself stops at the file, as before the upfront check
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "b/1.png" in err and "--skip-bad-samples" in err, err
    assert main(cmd + ["--skip-bad-samples"]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 unreadable or malformed sample file" in out
    assert list(json.loads((tmp_path / "run" / "bad_samples.json").read_text())) == [str(root / "b/1.png")]


def test_ocr_lines_stop_naming_the_file_or_skip_it(tmp_path):
    from polymixer.experiments.ocr.data import load_split

    root = tmp_path / "lines_ds"
    (root / "lines").mkdir(parents=True)
    names = []
    for i, text in enumerate(["abc", "de f", "ghi", "jk"]):
        Image.new("L", (8 + 7 * len(text), 40), 255).save(root / "lines" / f"p00-{i:02d}.png")
        (root / "lines" / f"p00-{i:02d}.txt").write_text(text + "\n")
        names.append(f"p00-{i:02d}.png")
    (root / "train.ln").write_text("\n".join(names) + "\n")
    bad = root / "lines" / "p00-02.png"
    bad.write_bytes(bad.read_bytes()[:30])  # truncated
    with pytest.raises(SampleError, match="p00-02.png"):
        load_split(root, "train", 32, None)
    f = SampleFaults(skip=True)
    lines = load_split(root, "train", 32, None, faults=f)
    assert lines.texts == ["abc", "de f", "jk"] and list(f.bad) == [str(bad)]


def test_eo_patches_stop_naming_the_file_or_skip_it(tmp_path):
    from polymixer.experiments.eo.data import PastisSplit, band_stats
    from polymixer.experiments.eo.synth import write_synthetic_pastis
    from polymixer.experiments.eo.task import EOTask

    root = write_synthetic_pastis(tmp_path / "synth", patches_per_fold=2, size=32, frames=(3, 4), progress=False)
    split = PastisSplit(root, (1, 2, 3))
    victim = split.records[1].s2_path
    victim.write_bytes(victim.read_bytes()[:-100])  # the header survives, the data is short
    with pytest.raises(SampleError, match=f"{victim.name} is truncated"):
        PastisSplit(root, (1, 2, 3))
    f = SampleFaults(skip=True)
    kept = PastisSplit(root, (1, 2, 3), faults=f)
    assert len(kept) == len(split) - 1 and list(f.bad) == [str(victim)]

    # malformed content met at batch time (a class id out of range): stop, or draw the next window instead
    target = kept.records[0].target_path
    t = np.load(target)
    t[0, 0, 0] = 25
    np.save(target, t)
    stats = band_stats(kept, "computed")
    for skip in (False, True):
        task = EOTask(kept, kept, stats, 64, 0, crop=16, faults=SampleFaults(skip=skip))
        if not skip:
            with pytest.raises(SampleError, match=f"{target.name} holds class 25"):
                task.batch(0, 0, 1, torch.device("cpu"))
        else:
            b = task.batch(0, 0, 1, torch.device("cpu"))
            assert b["x"].shape[0] == 64 and list(task.faults.bad) == [str(target)]
            assert int(b["labels"].max()) <= 19


def test_point_clouds_stop_naming_the_file_or_skip_it(tmp_path):
    from polymixer.experiments.points.data import PointDataset
    from polymixer.experiments.points.synth import write_synthetic_rooms
    from polymixer.experiments.points.task import PointTask

    root = write_synthetic_rooms(tmp_path / "rooms", train=3, val=1, test=1, points=600, seed=1, progress=False)
    data = PointDataset(root, "train")
    victim = data.paths[1][0] / "coord.npy"
    victim.write_bytes(b"garbage")
    for skip in (False, True):
        task = PointTask(PointDataset(root, "train"), PointDataset(root, "val"), 8, 0, None,
                         faults=SampleFaults(skip=skip))
        if not skip:
            with pytest.raises(SampleError, match="coord.npy"):
                task.batch(0, 0, 1, torch.device("cpu"))
        else:
            b = task.batch(0, 0, 1, torch.device("cpu"))
            assert int(b["offset"].numel()) == 8 and list(task.faults.bad) == [str(data.paths[1][0])]


def test_text_files_stop_naming_the_file_or_skip_it(tmp_path, monkeypatch, polymixer_cache):
    from polymixer.experiments.lm.data import prepare_corpus

    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(4):
        (folder / f"doc{i}.txt").write_text(f"document {i} " * 50)
    real = Path.read_bytes

    def failing(self):
        if self.name == "doc2.txt":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", failing)
    with pytest.raises(SampleError, match="doc2.txt"):
        prepare_corpus([folder], progress=False)
    f = SampleFaults(skip=True)
    corpus = prepare_corpus([folder], progress=False, faults=f)
    assert corpus.meta["files"] == 3 and list(corpus.meta["skipped"]) == [str(folder / "doc2.txt")]
    monkeypatch.setattr(Path, "read_bytes", real)  # repaired: a corpus that skipped files is not reused
    assert prepare_corpus([folder], progress=False).meta["files"] == 4


def test_a_resumed_skipping_run_keeps_its_count(tmp_path):
    files = _files(tmp_path / "a")
    files[3].write_bytes(b"")  # bad from the start
    _fit(FileTask(files, skip=True), TrainConfig(**{**vars(_cfg(tmp_path / "run", True)), "stop_after": 6}))
    model, res = _fit(FileTask(files, skip=True), _cfg(tmp_path / "run", True))
    assert [r["step"] for r in res["history"] if "loss" in r] == list(range(1, 13))
    assert res["history"][-1]["bad_samples"] == 1
    saved = torch.nn.Linear(4, 1)
    load_weights(saved, tmp_path / "run")
    assert all(torch.equal(a, b) for a, b in zip(saved.parameters(), model.parameters()))
