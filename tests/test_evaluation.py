"""Evaluation never costs a run its training: a step's checkpoint is published before that step's evaluation, an
evaluation that fails leaves it resumable (the resumed run evaluates that step first, and ends where the
uninterrupted run ends), a finished evaluation's metrics sit beside the checkpoint; under context parallelism the
language model's evaluation splits every window as training does — no rank runs a whole window, no forward more
windows than a training micro-batch — and equals the one-process evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ToyRegression, rank_results, torchrun

from polymixer.checkpoint import load_trainer_state, resolve_checkpoint
from polymixer.experiments.lm.data import TokenWindows
from polymixer.experiments.lm.task import MAX_COVERAGE, window_count
from polymixer.experiments.train.loop import EVALUATION, TrainConfig, train


def _run(out: Path, task: ToyRegression, **kw) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    cfg = TrainConfig(**{**dict(steps=6, batch_size=8, lr=1e-2, warmup=1, eval_every=2, ckpt_every=2, log_every=1,
                                out=str(out), progress=False, curves=False), **kw})
    res = train(model, task, cfg, {"family": "toy", "model": {}})
    return {**res, "weights": {k: v.clone() for k, v in model.state_dict().items()}}


def test_a_failed_evaluation_leaves_its_steps_checkpoint_and_the_resumed_run_evaluates_it_first(tmp_path):
    straight = _run(tmp_path / "straight", ToyRegression())
    # the checkpoint of every evaluated step carries that evaluation's metrics beside it
    for step in (2, 4, 6):
        ck = tmp_path / "straight" / "checkpoints" / f"step_{step:08d}"
        assert json.loads((ck / EVALUATION).read_text())["step"] == step
    with pytest.raises(RuntimeError, match="evaluation of step 4 failed"):
        _run(tmp_path / "run", ToyRegression(fail_at=4))
    ck = resolve_checkpoint(tmp_path / "run")
    assert ck.name == "step_00000004" and not (ck / EVALUATION).exists()  # published before the evaluation
    assert load_trainer_state(ck)["step"] == 4
    again = ToyRegression()
    resumed = _run(tmp_path / "run", again)
    assert again.evaluated == [4, 6]  # the evaluation that never ended, first; then the run goes on
    for k, v in straight["weights"].items():
        assert torch.equal(resumed["weights"][k], v), k
    def figures(history):  # (what does not depend on timing)
        return [(r["step"], r.get("loss"), r.get("eval_norm")) for r in history]

    assert figures(resumed["history"]) == figures(straight["history"])
    # a run resumed at its end reports its last evaluation from beside the checkpoint, without evaluating again
    done = ToyRegression()
    assert _run(tmp_path / "run", done)["metrics"] == straight["metrics"] and done.evaluated == []


def test_a_stop_after_an_evaluated_checkpoint_does_not_evaluate_again(tmp_path):
    first = ToyRegression()
    _run(tmp_path / "run", first, stop_after=4)
    assert first.evaluated == [2, 4]
    second = ToyRegression()
    _run(tmp_path / "run", second)
    assert second.evaluated == [6]


def test_an_evaluation_reads_the_split_at_most_four_times_over():
    data = np.zeros(1000, dtype=np.uint16)
    assert window_count(TokenWindows(data, 8), 256) == 256
    assert window_count(TokenWindows(data, 100), 256) == MAX_COVERAGE * 10
    assert window_count(TokenWindows(data, 900), 256) == 5  # ⌈4 × 1000 / 900⌉


EVAL = r"""
import numpy as np
import torch, torch.distributed as dist
from polymixer import context_parallel
from polymixer.models import create_model
from polymixer.experiments.lm.data import TokenWindows
from polymixer.experiments.lm.task import evaluate_lm

dist.init_process_group("gloo")
rows = {}
for preset in ("tiny-pom", "tiny-hybrid", "tiny-vpom"):
    torch.manual_seed(0)
    model = create_model(preset, n_layer=2, n_embd=32, n_head=2, block_size=64, window=8, sel_heads=2,
                         value_dim=32, value_heads=2)
    windows = TokenWindows(np.random.default_rng(0).integers(0, 256, 3000).astype(np.uint16), 64)
    token_bytes = torch.ones(257, dtype=torch.int64)
    whole = evaluate_lm(model, windows, token_bytes, None, count=5, batch=2)
    shapes = []
    hook = model.register_forward_pre_hook(lambda m, args: shapes.append(list(args[0].shape)))
    with context_parallel():
        split = evaluate_lm(model, windows, token_bytes, None, count=5, batch=2)
    hook.remove()
    rows[preset] = {"whole": whole, "split": split, "shapes": shapes}
report(rows)
"""


def test_context_parallel_evaluation_splits_every_window_and_equals_one_process(tmp_path):
    torchrun(EVAL, [], tmp_path, 2, name="cp_eval.py")
    for row in rank_results(tmp_path, 2):
        for preset, r in row.items():
            assert r["shapes"] == [[2, 32], [2, 32], [1, 32]], preset  # half of each 64-token window, 2 at a time
            assert sorted(r["split"]) == ["val_bpb", "val_loss"]
            for k, v in r["whole"].items():
                assert abs(r["split"][k] - v) <= 1e-6 * abs(v), (preset, k, r["split"][k], v)


def test_a_task_that_evaluates_like_it_trains_forwards_no_more_than_a_training_micro_batch(tmp_path):
    class Split(ToyRegression):
        split_evaluation, eval_batch = True, 32

    task = Split()
    _run(tmp_path / "run", task, steps=2, grad_accum=2)
    assert task.eval_batch == 4  # 8 examples per step in 2 micro-batches
    plain = ToyRegression()
    plain.eval_batch = 32
    _run(tmp_path / "plain", plain, steps=2, grad_accum=2)
    assert plain.eval_batch == 32  # (a task that does not ask keeps its own)
