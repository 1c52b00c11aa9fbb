"""Verified checkpoints: a manifest written last, verification on load, fallback to the newest intact checkpoint,
retention of intact ones only, write failures that leave earlier checkpoints alone, one-line errors in the commands."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import torchrun

from polymixer.experiments.cli import main
from polymixer.models import create_model
from polymixer.checkpoint import (
    CheckpointError, checkpoint_folder, checkpoint_step, load_model, load_trainer_state, resolve_checkpoint,
    save_checkpoint, verify_checkpoint,
)

MODEL = dict(n_layer=2, n_embd=32, n_head=2, block_size=32, window=8, sel_heads=2)


def _run(tmp_path, steps=(1, 2, 3), keep=5):
    model = create_model("tiny-pom", **MODEL)
    meta = {"family": "lm", "preset": "tiny-pom", "model": {**vars(model.config)}, "data": {"tokenizer": "bytes"}}
    out = tmp_path / "run"
    for s in steps:
        with torch.no_grad():
            model.wte.weight.fill_(float(s))
        save_checkpoint(out, s, model, meta, {"step": s, "optimizer": {}, "rng": {}}, keep=keep)
    return out


def _damage(f, how):
    if how == "truncated":
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2])
    elif how == "missing":
        f.unlink()
    else:  # garbage of the same size
        f.write_bytes(os.urandom(f.stat().st_size))


def test_manifest_is_written_and_verifies(tmp_path):
    ck = resolve_checkpoint(_run(tmp_path, steps=(1,)))
    files = json.loads((ck / "manifest.json").read_text())["files"]
    assert set(files) == {"model.safetensors", "config.json", "trainer.pt"}
    assert verify_checkpoint(ck) is None


@pytest.mark.parametrize("how", ["truncated", "missing", "garbage"])
@pytest.mark.parametrize("name", ["model.safetensors", "trainer.pt", "config.json"])
def test_a_damaged_newest_checkpoint_falls_back(tmp_path, how, name):
    run = _run(tmp_path)
    _damage(run / "checkpoints" / "step_00000003" / name, how)
    problem = verify_checkpoint(run / "checkpoints" / "step_00000003")
    assert problem and name in problem
    with pytest.warns(UserWarning, match=f"skipping checkpoint step_00000003: .*{name}"):
        ck = resolve_checkpoint(run)
    assert ck.name == "step_00000002"
    assert float(load_model(run).wte.weight.detach()[0, 0]) == 2.0
    assert load_trainer_state(run)["step"] == 2
    with pytest.raises(CheckpointError, match=name):
        resolve_checkpoint(run / "checkpoints" / "step_00000003")


def test_use_commands_give_one_line_errors(tmp_path, capsys):
    run = _run(tmp_path, steps=(1,))
    _damage(run / "checkpoints" / "step_00000001" / "model.safetensors", "truncated")
    for args in (["generate", "--ckpt", str(run), "--max-new-tokens", "2"],
                 ["eval", "lm", "--ckpt", str(run / "checkpoints" / "step_00000001")]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "model.safetensors" in err and "Traceback" not in err


def test_an_unverified_legacy_file_error_names_the_file(tmp_path, capsys):
    run = _run(tmp_path, steps=(1,))
    ck = run / "checkpoints" / "step_00000001"
    (ck / "manifest.json").unlink()  # a checkpoint from before manifests existed
    _damage(ck / "model.safetensors", "truncated")
    assert main(["generate", "--ckpt", str(run), "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors: unreadable" in err and "Traceback" not in err


def test_a_checkpoint_folder_names_its_step_and_nothing_else_passes_for_one(tmp_path):
    run = _run(tmp_path, steps=(7, 1234))
    assert resolve_checkpoint(run) == checkpoint_folder(run, 1234)
    assert [checkpoint_step(p) for p in sorted((run / "checkpoints").glob("step_*"))] == [7, 1234]
    for bad in ("latest", "step_", "step_12a", "stage1", "run"):
        with pytest.raises(ValueError, match=f"{bad} is not a checkpoint folder"):
            checkpoint_step(run / bad)


def test_retention_counts_only_intact_checkpoints(tmp_path):
    run = _run(tmp_path, steps=(1, 2), keep=2)
    _damage(run / "checkpoints" / "step_00000002" / "model.safetensors", "truncated")
    model = create_model("tiny-pom", **MODEL)
    save_checkpoint(run, 3, model, {"family": "lm", "model": {**vars(model.config)}}, keep=2)
    names = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    # the damaged step 2 does not count: the intact step 1 stays as the second kept checkpoint
    assert names == ["step_00000001", "step_00000002", "step_00000003"]
    save_checkpoint(run, 4, model, {"family": "lm", "model": {**vars(model.config)}}, keep=2)
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_00000003", "step_00000004"]


def test_a_write_killed_midway_is_ignored_and_its_leftovers_removed_by_the_next_save(tmp_path):
    """What SIGKILL inside a save leaves (a half-written temporary checkpoint folder, a temporary ``latest``, the old
    copy of a step being re-saved) is never taken for a checkpoint, and the next save of the run removes it."""
    out = _run(tmp_path)
    root = out / "checkpoints"
    half = root / ".step_00000004.tmp-99999"
    half.mkdir()
    data = (root / "step_00000003" / "model.safetensors").read_bytes()
    (half / "model.safetensors").write_bytes(data[: len(data) // 2])
    (root / ".latest.tmp-99999").write_text("step_00000004")
    old = root / ".step_00000002.old-99999"
    old.mkdir()
    (old / "config.json").write_text("{}")
    assert resolve_checkpoint(out) == root / "step_00000003"
    assert (root / "latest").read_text() == "step_00000003"
    model = create_model("tiny-pom", **MODEL)
    save_checkpoint(out, 4, model, {"family": "lm"}, {"step": 4, "optimizer": {}, "rng": {}}, keep=5)
    assert sorted(p.name for p in root.iterdir()) == ["latest"] + [f"step_0000000{s}" for s in (1, 2, 3, 4)]
    assert resolve_checkpoint(out) == root / "step_00000004" and verify_checkpoint(root / "step_00000004") is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_a_failing_write_leaves_earlier_checkpoints_intact(tmp_path):
    run = _run(tmp_path, steps=(1,))
    root = run / "checkpoints"
    before = {p.name: p.stat().st_mtime_ns for p in root.rglob("*")}
    os.chmod(root, 0o555)
    try:
        model = create_model("tiny-pom", **MODEL)
        with pytest.raises(CheckpointError, match="could not write checkpoint .*step_00000002.*unchanged"):
            save_checkpoint(run, 2, model, {"family": "lm", "model": {**vars(model.config)}})
    finally:
        os.chmod(root, 0o755)
    assert {p.name: p.stat().st_mtime_ns for p in root.rglob("*")} == before
    assert resolve_checkpoint(run).name == "step_00000001"


def test_a_failing_write_of_a_file_leaves_earlier_checkpoints_intact(tmp_path, monkeypatch):
    """Disk full while writing (simulated: the optimizer-state writer raises ENOSPC), for root too."""
    import errno

    run = _run(tmp_path, steps=(1,))

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    model = create_model("tiny-pom", **MODEL)
    with pytest.raises(CheckpointError, match="No space left on device"):
        save_checkpoint(run, 2, model, {"family": "lm", "model": {**vars(model.config)}}, {"step": 2})
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_00000001"]
    assert resolve_checkpoint(run).name == "step_00000001" and verify_checkpoint(resolve_checkpoint(run)) is None


@pytest.mark.parametrize("how", ["truncated", "missing", "garbage"])
def test_training_resumes_from_the_newest_intact_checkpoint_bit_exact(tmp_path, how, corpus_dir, polymixer_cache):
    from polymixer.experiments.lm.task import train_lm
    from polymixer.experiments.train.loop import TrainConfig

    corpus = corpus_dir

    def cfg(out, steps):
        return TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup=2, eval_every=100, ckpt_every=3, log_every=1,
                           out=str(out), progress=False, seed=7)

    ref = train_lm("tiny-hybrid", cfg(tmp_path / "ref", 9), [str(corpus)], eval_windows=4, **MODEL)["model"]
    train_lm("tiny-hybrid", cfg(tmp_path / "cut", 6), [str(corpus)], eval_windows=4, **MODEL)
    _damage(tmp_path / "cut" / "checkpoints" / "step_00000006" / "model.safetensors", how)
    with pytest.warns(UserWarning, match="skipping checkpoint step_00000006"):
        res = train_lm("tiny-hybrid", cfg(tmp_path / "cut", 9), [str(corpus)], eval_windows=4, **MODEL)
    assert [r["step"] for r in res["history"] if "loss" in r] == list(range(1, 10))  # resumed after step 3
    for k, v in ref.state_dict().items():
        assert torch.equal(v, res["model"].state_dict()[k]), k


class _NaNAt:
    """A toy regression task whose loss is NaN at the given steps."""

    unit = "ex"

    def __init__(self, bad_steps):
        self.bad = set(bad_steps)
        self.step = 0

    def batch(self, step, share, shares, device):
        self.step = step
        g = torch.Generator().manual_seed(step)
        return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)

    def count(self, batch):
        return batch[0].shape[0]

    def loss(self, model, batch):
        x, y = batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        return loss * float("nan") if self.step in self.bad else loss

    def evaluate(self, model, step, out_dir):
        return {}


def _snapshot(model, opt_state):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {k: {n: t.clone() for n, t in v.items() if isinstance(t, torch.Tensor)} for k, v in opt_state.items()})


@pytest.mark.parametrize("sam", [0.0, 0.05], ids=["adamw", "sam"])  # SAM must not climb along a NaN gradient
def test_a_non_finite_step_is_skipped_and_leaves_the_optimizer_state_unchanged(tmp_path, sam):
    from polymixer.experiments.train import loop

    seen = {}
    real_step = torch.optim.AdamW.step

    def spy(self, *a, **k):
        before = _snapshot(model, self.state)
        out = real_step(self, *a, **k)
        seen.setdefault("calls", []).append((before, _snapshot(model, self.state)))
        return out

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    cfg = loop.TrainConfig(steps=4, batch_size=8, lr=1e-2, warmup=1, eval_every=10, ckpt_every=10, log_every=1,
                           out=str(tmp_path / "run"), progress=False, ema=0.9, sam_rho=sam)
    torch.optim.AdamW.step = spy
    try:
        res = loop.train(model, _NaNAt({2}), cfg, {"family": "toy", "model": {}})
    finally:
        torch.optim.AdamW.step = real_step
    assert len(seen["calls"]) == 3  # steps 1, 2 and 4 stepped; step 3 (index 2) was skipped
    (_, (w2, m2)), ((w4, m4), _) = seen["calls"][1], seen["calls"][2]
    # what step 4 started from = what step 2 left: the skipped step changed neither weights nor Adam's moments
    assert all(torch.equal(w2[k], w4[k]) for k in w2)
    assert m2.keys() == m4.keys() and all(torch.equal(m2[p][n], m4[p][n]) for p in m2 for n in m2[p])
    hist = [r for r in res["history"] if "loss" in r]
    assert [r["skipped"] for r in hist] == [0, 0, 1, 1]
    assert all(torch.isfinite(p).all() for p in model.parameters())


class _NaNInSecondPass(_NaNAt):
    """Finite on the first forward of every step; NaN on the second forward (SAM's) of the given steps."""

    def __init__(self, bad_steps):
        super().__init__(bad_steps)
        self.calls = {}

    def loss(self, model, batch):
        x, y = batch
        n = self.calls[self.step] = self.calls.get(self.step, 0) + 1
        loss = torch.nn.functional.mse_loss(model(x), y)
        return loss * float("nan") if self.step in self.bad and n == 2 else loss


@pytest.mark.parametrize("seed", range(6))
def test_sam_restores_the_exact_weights_it_climbed_from(tmp_path, seed):
    """SAM puts back the very weights it climbed from (not (w + e) − e): a step whose second pass is NaN is skipped
    with every weight bit-identical, and the weights an optimizer step starts from are those of the step before."""
    from polymixer.experiments.train import loop

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    starts, ends = [], []
    real_step = torch.optim.AdamW.step

    def spy(self, *a, **k):
        starts.append([p.detach().clone() for p in model.parameters()])
        out = real_step(self, *a, **k)
        ends.append([p.detach().clone() for p in model.parameters()])
        return out

    task = _NaNInSecondPass({2})
    cfg = loop.TrainConfig(steps=4, batch_size=8, lr=3e-2, warmup=1, eval_every=10, ckpt_every=10, log_every=1,
                           out=str(tmp_path / "run"), progress=False, sam_rho=0.5, seed=seed)
    torch.optim.AdamW.step = spy
    try:
        res = loop.train(model, task, cfg, {"family": "toy", "model": {}})
    finally:
        torch.optim.AdamW.step = real_step
    assert task.calls == {0: 2, 1: 2, 2: 2, 3: 2}  # two passes per step: SAM ran every time
    assert len(starts) == 3  # step index 2 was skipped for its NaN second pass
    # each optimizer step starts from exactly what the previous one left (the skipped step in between included)
    for before, after in ((starts[1], ends[0]), (starts[2], ends[1])):
        assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert [r["skipped"] for r in res["history"] if "loss" in r] == [0, 0, 1, 1]


def test_consecutive_non_finite_steps_stop_the_run_with_the_checkpoint_intact(tmp_path, capsys):
    from polymixer.experiments.train import loop

    model = torch.nn.Linear(4, 1)
    cfg = loop.TrainConfig(steps=20, batch_size=8, lr=1e-2, warmup=1, eval_every=100, ckpt_every=2,
                           out=str(tmp_path / "run"), progress=False, max_nonfinite=3)
    with pytest.raises(FloatingPointError, match="3 consecutive steps .* step 7.*intact"):
        loop.train(model, _NaNAt({4, 5, 6}), cfg, {"family": "toy", "model": {}})
    ck = resolve_checkpoint(tmp_path / "run")  # step 6: skipped steps 5–6 left the step-4 weights in it
    assert ck.name == "step_00000006" and verify_checkpoint(ck) is None
    from polymixer.checkpoint import load_weights

    saved = torch.nn.Linear(4, 1)
    load_weights(saved, ck)
    assert all(torch.isfinite(p).all() for p in saved.parameters())


def test_sigterm_checkpoints_exits_75_and_resumes_bit_exact(tmp_path, corpus_dir):
    """A real process: SIGTERM mid-run → the step in flight finishes, a checkpoint, status 75; the same command
    resumes and ends with the weights of an uninterrupted run."""
    import signal
    import subprocess
    import sys
    import time

    from polymixer.experiments.train.loop import EXIT_PREEMPTED

    corpus = corpus_dir
    env = {**os.environ, "POLYMIXER_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}

    def cmd(out):
        return [sys.executable, "-m", "polymixer", "train", "lm", "--preset", "tiny-hybrid", "--n-layer", "2",
                "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--window", "8", "--sel-heads", "2",
                "--steps", "80", "--batch-size", "4", "--warmup", "2", "--eval-every", "1000", "--ckpt-every", "5",
                "--eval-windows", "4", "--data", str(corpus), "--out", str(out), "--quiet"]

    proc = subprocess.Popen(cmd(tmp_path / "cut"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    latest = tmp_path / "cut" / "checkpoints" / "latest"
    deadline = time.time() + 120
    while not latest.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, err
    assert "SIGTERM: stopped after step" in out
    step = int(out.split("stopped after step ")[1].split()[0])
    assert 5 <= step < 80 and resolve_checkpoint(tmp_path / "cut").name == f"step_{step:08d}"
    assert subprocess.run(cmd(tmp_path / "cut"), env=env, capture_output=True, timeout=300).returncode == 0
    assert subprocess.run(cmd(tmp_path / "ref"), env=env, capture_output=True, timeout=300).returncode == 0
    a, b = load_model(tmp_path / "cut"), load_model(tmp_path / "ref")
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


DDP_SIGTERM_SCRIPT = """
import os, signal, sys
import torch
from polymixer.experiments.train.loop import Preempted, TrainConfig, train

rank = int(os.environ.get("RANK", 0))


class Task:
    unit = "ex"

    def batch(self, step, share, shares, device):
        if step == 6 and rank == 1:  # only rank 1 is told to stop, in the middle of step 7
            os.kill(os.getpid(), signal.SIGTERM)
        g = torch.Generator().manual_seed(step * 100 + share)
        return torch.randn(4, 4, generator=g), torch.randn(4, 1, generator=g)

    def count(self, batch):
        return 4

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    def evaluate(self, model, step, out_dir):
        return {}


torch.manual_seed(0)
out = sys.argv[1]
cfg = TrainConfig(steps=50, batch_size=8, lr=1e-2, warmup=1, eval_every=1000, ckpt_every=1000, out=out,
                  progress=False)
try:
    train(torch.nn.Linear(4, 1), Task(), cfg, {"family": "toy", "model": {}})
except Preempted as e:
    open(os.path.join(out, f"stopped_rank{rank}"), "w").write(str(e.step))
    raise
"""


def test_sigterm_on_one_torchrun_rank_stops_every_rank_after_the_same_step(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    res = torchrun(DDP_SIGTERM_SCRIPT, [out], tmp_path, 2, status=1, name="ddp_sigterm.py", timeout=300)
    steps = [(out / f"stopped_rank{r}").read_text() for r in (0, 1)]
    assert steps == ["7", "7"], res.stderr[-2000:]
    assert [p.name for p in (out / "checkpoints").glob("step_*")] == ["step_00000007"]  # written once
    assert verify_checkpoint(out / "checkpoints" / "step_00000007") is None


@pytest.mark.slow  # ~100 s of process restarts; the pieces it chains are tested one by one above
def test_bench_faults_kills_inside_a_checkpoint_write_and_every_fault_is_survived(tmp_path, corpus_dir,
                                                                                   polymixer_cache):
    """The fault-injection bench on a tiny LM: SIGKILL (one of them while model.safetensors sits in the temporary
    folder of a checkpoint write), SIGTERM, a truncated newest checkpoint and a NaN loss, each resumed by the same
    command; every run ends bit-identical to its uninterrupted twin and no temporary folder is left behind."""
    from polymixer.experiments.bench.faults import FaultsBenchConfig, report, run

    cfg = FaultsBenchConfig(families=("lm",), steps=10, ckpt_every=2, kills=2, write_kills=1, timeout=300,
                            extra={"lm": ["--data", str(corpus_dir), "--n-embd", "32", "--block-size", "32"]},
                            out=str(tmp_path / "bench"))
    payload = run(cfg, progress=False)
    rows = {r["row"]: r for r in payload["families"]["lm"]["rows"]}
    assert set(rows) == {"sigkill", "sigterm", "truncated", "nan"}
    for r in rows.values():
        assert r["survived"] == r["injected"] >= 1 and r["identical"], r
    kill = rows["sigkill"]
    assert kill["injected"] == 2 and kill["leftover_temp"] == 0
    held = [e for e in kill["events"] if e["moment"].startswith("writing checkpoint")]
    assert len(held) == 1 and held[0]["leftover_temp"] == 1  # the killed write's folder, cleaned by the next save
    assert held[0]["checkpoint_after"] < int(held[0]["moment"].split()[-1])  # resume fell back to the one before
    assert rows["sigterm"]["exit_status"] == 75 and rows["sigterm"]["steps_lost"] == 0
    assert rows["truncated"]["steps_lost"] == 2 and rows["nan"]["skipped_step_no_op"]
    assert "target (every row survived, final weights identical): met" in report(payload)
    assert (tmp_path / "bench" / "faults.png").is_file()


def test_a_skipped_step_restores_batchnorm_running_statistics(tmp_path):
    """A forward in training mode updates BatchNorm's running statistics; a skipped step must not keep them."""
    from polymixer.experiments.train import loop

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(4)
            self.fc = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.fc(self.bn(x))

    def run(out, bad, stop_after):
        torch.manual_seed(0)
        model = Net()
        cfg = loop.TrainConfig(steps=6, batch_size=8, lr=1e-2, warmup=1, eval_every=100, ckpt_every=100,
                               out=str(out), progress=False, stop_after=stop_after)
        loop.train(model, _NaNAt(bad), cfg, {"family": "toy", "model": {}})
        return model

    before = run(tmp_path / "a", set(), 2)  # the state after step 2
    after = run(tmp_path / "b", {2}, 3)  # steps 1, 2, then step 3 (index 2) skipped
    for k, v in before.state_dict().items():
        assert torch.equal(v, after.state_dict()[k]), k
