"""The shared training loop: checkpoints, exact resume, config mismatch, DDP with 2 CPU processes, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import torchrun

from polymixer.experiments.cli import main
from polymixer.experiments.lm.task import evaluate_checkpoint, train_lm
from polymixer.checkpoint import load_model, resolve_checkpoint
from polymixer.experiments.train.loop import TrainConfig, lr_at

MODEL = dict(n_layer=2, n_embd=32, n_head=2, block_size=32, window=8, sel_heads=2)


pytestmark = pytest.mark.usefixtures("polymixer_cache")


def _cfg(tmp_path, **kw):
    base = dict(steps=6, batch_size=4, lr=3e-3, warmup=2, eval_every=3, ckpt_every=3, log_every=1, out=str(tmp_path /
                "run"), progress=False, seed=7)
    base.update(kw)
    return TrainConfig(**base)


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_lr_schedule():
    cfg = TrainConfig(steps=100, warmup=10, lr=1.0, min_lr=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(99, cfg) == pytest.approx(0.1, abs=1e-3) and 0.1 < lr_at(50, cfg) < 1.0


def test_train_checkpoint_roundtrip_and_exact_resume(tmp_path, corpus_dir):
    res = train_lm("tiny-hybrid", _cfg(tmp_path / "a"), [str(corpus_dir)], dropout=0.1, **MODEL)
    assert set(res["metrics"]) == {"val_loss", "val_bpb"}
    ck = resolve_checkpoint(tmp_path / "a" / "run")
    assert ck.name == "step_00000006" and (ck / "model.safetensors").is_file()
    model = load_model(ck)
    idx = torch.randint(0, 256, (2, 20))
    again = load_model(tmp_path / "a" / "run")
    torch.testing.assert_close(model.eval()(idx)[0], again.eval()(idx)[0], rtol=0, atol=0)
    # interrupted after step 3, resumed to step 6: bit-identical to the uninterrupted run
    b = _cfg(tmp_path / "b", stop_after=3)
    train_lm("tiny-hybrid", b, [str(corpus_dir)], dropout=0.1, **MODEL)
    assert resolve_checkpoint(tmp_path / "b" / "run").name == "step_00000003"
    train_lm("tiny-hybrid", replace(b, stop_after=None), [str(corpus_dir)], dropout=0.1, **MODEL)
    resumed = load_model(tmp_path / "b" / "run")
    for (k, v1), v2 in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(v1, v2), k
    hist = json.loads((tmp_path / "b" / "run" / "history.json").read_text())
    assert [h["step"] for h in hist if "loss" in h] == [1, 2, 3, 4, 5, 6]
    # the seconds trained accumulate across the interruption (a bench's train_min counts both invocations)
    seconds = [h["train_s"] for h in hist if "loss" in h]
    assert all(0 < a < b for a, b in zip(seconds, seconds[1:]))


def test_resume_with_a_different_model_lists_the_differences(tmp_path, corpus_dir):
    train_lm("tiny-pom", _cfg(tmp_path, steps=2, ckpt_every=2, eval_every=2), [str(corpus_dir)], **MODEL)
    with pytest.raises(ValueError, match=r"n_layer: checkpoint 2 vs now 4.*|differs — .*n_layer"):
        train_lm("tiny-pom", _cfg(tmp_path, steps=4), [str(corpus_dir)], **{**MODEL, "n_layer": 4})


def test_cli_train_generate_eval(tmp_path, corpus_dir, capsys):
    out = tmp_path / "cli"
    rc = main(["train", "lm", "--preset", "tiny-pom", "--data", str(corpus_dir), "--n-layer", "2", "--n-embd", "32",
               "--n-head", "2", "--sel-heads", "2", "--block-size", "32", "--steps", "4", "--batch-size", "4",
               "--eval-every", "4", "--ckpt-every", "4", "--eval-windows", "8", "--out", str(out), "--quiet"])
    assert rc == 0
    assert "val_bpb" in capsys.readouterr().out
    rc = main(["generate", "--ckpt", str(out), "--prompt", "def ", "--prompt", "import", "--max-new-tokens", "20",
               "--seed", "1"])
    text = capsys.readouterr().out
    assert rc == 0 and "--- sample 1 ---" in text and "def " in text
    res = evaluate_checkpoint(str(out), windows=8, lengths=(1, 2, 4))
    assert [r["context"] for r in res["lengths"]] == [32, 64, 128] and all(r["val_loss"] for r in res["lengths"])
    rc = main(["eval", "lm", "--ckpt", str(out), "--windows", "8"])
    assert rc == 0 and "| 128 | 4 |" in capsys.readouterr().out
    rc = main(["generate", "--ckpt", str(tmp_path / "nothing")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err
    rc = main(["train", "lm", "--preset", "tiny-pom", "--data", str(tmp_path / "missing"), "--out", str(out)])
    assert rc == 2


DDP_SCRIPT = r"""
import sys, torch
from polymixer.experiments.lm.task import train_lm
from polymixer.experiments.train.loop import TrainConfig
cfg = TrainConfig(steps=4, batch_size=8, lr=3e-3, warmup=1, eval_every=100, ckpt_every=4, log_every=1,
                  out=sys.argv[1], progress=False, seed=3)
res = train_lm("tiny-hybrid", cfg, [sys.argv[2]], eval_windows=8, n_layer=2, n_embd=32, n_head=2, block_size=32,
               window=8, sel_heads=2)
flat = torch.cat([p.detach().flatten() for p in res["model"].parameters()])
torch.save(flat, f"{sys.argv[1]}/params_rank{res['rank']}_of_{res['world']}.pt")
"""


def test_ddp_two_processes_match_single_process(tmp_path, corpus_dir):
    """torchrun with 2 CPU processes (gloo): the ranks stay in sync and match one process on the same global batch."""
    env = {"POLYMIXER_CACHE": str(tmp_path / "cache")}
    for folder, procs in (("single", 1), ("ddp", 2)):
        torchrun(DDP_SCRIPT, [tmp_path / folder, corpus_dir], tmp_path, procs, env=env, name="ddp_train.py",
                 timeout=300)
    one = torch.load(tmp_path / "single" / "params_rank0_of_1.pt")
    r0 = torch.load(tmp_path / "ddp" / "params_rank0_of_2.pt")
    r1 = torch.load(tmp_path / "ddp" / "params_rank1_of_2.pt")
    assert torch.equal(r0, r1), "the two ranks drifted apart"
    torch.testing.assert_close(r0, one, rtol=1e-4, atol=1e-5)


def test_ema_warmup_forgets_the_initialisation():
    from polymixer.experiments.train.loop import _Ema

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    init = model.weight.detach().clone()
    ema = _Ema(model, 0.999)
    assert ema.decay_at(0) == pytest.approx(0.1) and ema.decay_at(10_000) == 0.999
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model, 0)
    torch.testing.assert_close(ema.model.weight, 0.1 * init + 0.9 * torch.ones_like(init))
    for step in range(1, 1500):
        ema.update(model, step)
    # the product of the warmed-up decays leaves a negligible share of the initialisation
    share = torch.tensor([ema.decay_at(n) for n in range(1500)], dtype=torch.float64).prod().item()
    assert share < 1e-3
    torch.testing.assert_close(ema.model.weight, torch.ones_like(init), atol=1e-3, rtol=0)


def test_init_from_starts_a_new_run_from_another_runs_weights(tmp_path, corpus_dir):
    """Fine-tuning: a new run starts exactly from the source run's weights (EMA ones when saved), only when it is not
    resuming, and refuses a source whose model differs."""
    src = _cfg(tmp_path / "src", steps=3, ckpt_every=3, eval_every=3)
    train_lm("tiny-pom", src, [str(corpus_dir)], **MODEL)
    start = load_model(tmp_path / "src" / "run")
    ft = _cfg(tmp_path / "ft", steps=2, ckpt_every=2, eval_every=2, lr=1e-12, min_lr=0.0, init_from=src.out)
    res = train_lm("tiny-pom", ft, [str(corpus_dir)], **MODEL)
    for (k, v1), v2 in zip(start.state_dict().items(), res["model"].state_dict().values()):
        # lr 1e-12 (0 is refused): AdamW moves a weight by ~lr a step, so the fine-tuned run is still the source to
        # 1e-10, where another initialisation differs by ~1e-2
        torch.testing.assert_close(v2, v1, rtol=0, atol=1e-10, msg=k)
    with pytest.raises(ValueError, match="cannot start from .*n_layer"):
        train_lm("tiny-pom", _cfg(tmp_path / "bad", steps=2, init_from=src.out), [str(corpus_dir)],
                 **{**MODEL, "n_layer": 4})


def test_a_rerun_says_it_is_complete_and_a_resumed_run_from_which_step(tmp_path, corpus_dir, capsys):
    """The same command again: a finished run says "already complete at step N of N" and trains nothing (no progress
    bar, the checkpoint untouched); a run stopped early says "resumed from step N of M" and continues."""
    out = tmp_path / "run"
    argv = ["train", "lm", "--preset", "tiny-pom", "--data", str(corpus_dir), "--n-layer", "1", "--n-embd", "32",
            "--n-head", "2", "--sel-heads", "2", "--block-size", "32", "--batch-size", "2", "--eval-every", "4",
            "--ckpt-every", "4", "--eval-windows", "4", "--out", str(out)]
    assert main(argv + ["--steps", "4", "--stop-after", "2", "--quiet"]) == 0
    assert f"{out}: resumed from" not in capsys.readouterr().out
    assert main(argv + ["--steps", "4"]) == 0
    captured = capsys.readouterr()
    assert f"{out}: resumed from step 2 of 4 ({out / 'checkpoints' / 'step_00000002'})" in captured.out
    assert resolve_checkpoint(out).name == "step_00000004"
    written = {p: p.stat().st_mtime_ns for p in (out / "checkpoints").rglob("*") if p.is_file()}
    assert main(argv + ["--steps", "4"]) == 0
    captured = capsys.readouterr()
    assert f"{out}: already complete at step 4 of 4: nothing to train" in captured.out
    assert "it/s" not in captured.err and "4/4" not in captured.err  # no bar pretending to train
    assert json.loads(captured.out[captured.out.index("{"):])["run"] == str(out)  # its result, as before
    assert {p: p.stat().st_mtime_ns for p in (out / "checkpoints").rglob("*") if p.is_file()} == written
    assert main(argv + ["--steps", "3", "--quiet"]) == 0
    assert "already complete at step 4 past --steps 3" in capsys.readouterr().out
