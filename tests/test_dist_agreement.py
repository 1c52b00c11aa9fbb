"""No hangs under torchrun: before the first step the ranks agree that they build the same model with the same
settings (a rank with another layer count, width or dtype makes every rank exit with the same one-line error within
seconds), and ``--dist-timeout`` reaches the process group (a rank that never joins a collective makes the others
fail with a timeout error instead of waiting half an hour)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from conftest import torchrun

from polymixer.experiments.train.agreement import describe_difference, fingerprint, model_facts
from polymixer.experiments.train.loop import TrainConfig
from polymixer.models import create_model

pytestmark = pytest.mark.usefixtures("polymixer_cache")

SMALL = dict(n_layer=2, n_embd=32, n_head=2, sel_heads=2, block_size=32)


def _facts(cfg: TrainConfig = TrainConfig(), amp=None, preset="tiny-pom", model=None, **kw):
    torch.manual_seed(0)
    model = model if model is not None else create_model(preset, **{**SMALL, **kw})
    config = {"family": "lm", "preset": preset, "model": {**SMALL, **kw}}
    return model_facts(model, config, cfg, amp, torch.device("cpu"))


def test_the_same_model_agrees_and_each_difference_is_named():
    """Without processes: the facts of two ranks and the line every rank would raise, for each kind of
    difference (the first in the order model, device, autocast, settings, block lists, parameters, config)."""
    same = _facts()
    assert describe_difference([same, _facts()]) is None and torch.equal(fingerprint(same), fingerprint(_facts()))
    prefix = "the ranks do not build the same model: "
    suffix = " — every rank must run the same command"
    cases = [
        (_facts(n_layer=1), "rank 1 builds 1 block in 'blocks' (rank 0: 2)"),
        (_facts(n_embd=48), "parameter wte.weight has shape (257, 48) on rank 1 (rank 0: (257, 32))"),
        (_facts(amp=torch.bfloat16), "rank 1 autocasts to bf16 (rank 0: fp32)"),
        (_facts(model=create_model("tiny-pom", **SMALL).to(torch.bfloat16)),
         "parameter wte.weight is bf16 on rank 1 (rank 0: fp32)"),
        (_facts(TrainConfig(context_parallel=2)), "rank 1 runs with --context-parallel 2 (rank 0: 1)"),
        (_facts(TrainConfig(activation_checkpointing="block")),
         "rank 1 runs with --activation-checkpointing block (rank 0: none)"),
        (_facts(preset="tiny-vpom"), "rank 1 builds lm/tiny-vpom (rank 0: lm/tiny-pom)"),
        (_facts(bias=False), "parameter blocks.0.norm1.bias missing on rank 1"),
    ]
    for other, line in cases:
        assert describe_difference([same, other]) == prefix + line + suffix
        assert not torch.equal(fingerprint(same), fingerprint(other)), line
    # the first rank that differs is named, whatever the others do
    assert describe_difference([same, same, _facts(n_layer=1), _facts(n_embd=48)]) == \
        prefix + "rank 2 builds 1 block in 'blocks' (rank 0: 2)" + suffix


WRAPPER = r"""
import os, sys, time
from polymixer.experiments.cli import main
from polymixer.experiments.train import loop

rank = int(os.environ["RANK"])
argv = sys.argv[1:]
i = argv.index("--rank1")
common, extra = argv[:i], argv[i + 1:]
if rank == 1 and extra == ["sleep"]:  # this rank misses the collective after step 1 for 20 s
    loop._agree_preempted = lambda run, flag: time.sleep(20)
elif rank == 1:
    common += extra
sys.exit(main(common))
"""


def _launch(tmp_path: Path, corpus_dir: Path, rank1: list, more: tuple = ()) -> tuple:
    """``polymixer train lm`` on 2 ranks (gloo), rank 1 with ``rank1`` added; (seconds, each rank's stderr lines).
    It fails (torchrun's status 1: a worker failed)."""
    logs = tmp_path / "logs"
    args = ["train", "lm", "--preset", "tiny-pom", "--data", corpus_dir, "--steps", "2", "--batch-size", "2",
            "--eval-every", "100", "--eval-windows", "4", "--out", tmp_path / "run", "--quiet", "--no-data-check",
            *more]
    for k, v in SMALL.items():
        args += ["--set", f"{k}={v}"]
    t0 = time.perf_counter()
    torchrun(WRAPPER, args + ["--rank1", *rank1], tmp_path, 2, status=1, name="wrapper.py", timeout=120,
             launch=[f"--log-dir={logs}", "--redirects=3"])
    took = time.perf_counter() - t0
    errs = [sorted(logs.glob(f"*/attempt_0/{r}/stderr.log"))[0].read_text().strip().splitlines() for r in (0, 1)]
    return took, errs


@pytest.mark.parametrize("rank1, line", [
    (["--set", "n_layer=1"], "rank 1 builds 1 block in 'blocks' (rank 0: 2)"),
    (["--set", "n_embd=48"], "parameter wte.weight has shape (257, 48) on rank 1 (rank 0: (257, 32))"),
    (["--dtype", "bf16"], "rank 1 autocasts to bf16 (rank 0: fp32)"),
], ids=["layers", "width", "dtype"])
def test_a_rank_that_builds_another_model_stops_every_rank_with_one_line(tmp_path, corpus_dir, rank1, line):
    """Under torchrun, before the first step: both ranks exit with status 2 and the same one line on stderr,
    within seconds (the process group's start included), not at a timeout."""
    took, errs = _launch(tmp_path, corpus_dir, rank1)
    expected = f"polymixer train lm: error: the ranks do not build the same model: {line} — every rank must run " \
               f"the same command"
    for r, err in enumerate(errs):
        assert err == [expected], (r, err)
    assert took < 60, took


@pytest.mark.slow  # waits for the timeout on purpose (~25 s)
def test_dist_timeout_reaches_the_process_group(tmp_path, corpus_dir):
    """``--dist-timeout 0.1`` (6 s): rank 1 misses a collective for 20 s, and rank 0 fails with gloo's timeout
    error after 6 s instead of waiting (without the timeout it would wait the 20 s out and the run would
    succeed)."""
    took, errs = _launch(tmp_path, corpus_dir, ["sleep"], ("--dist-timeout", "0.1"))
    assert any("Timed out waiting 6000ms" in line for line in errs[0]), errs[0][-5:]
    assert took < 90, took  # (20 s asleep, the two starts and torchrun's shutdown on 2 shared cores)
