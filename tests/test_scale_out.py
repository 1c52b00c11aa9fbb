"""The training loop on several CPU processes (torchrun, gloo): a context-parallel step equals the single-process
step on the same batch and resumes bit-exactly after a stop; FSDP2 runs save checkpoints that resume on fewer ranks
and without sharding to the weights an unsharded run reaches."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from conftest import torchrun

pytestmark = pytest.mark.usefixtures("polymixer_cache")

SCRIPT = r"""
import json, sys
import torch
from polymixer.experiments.lm.task import train_lm
from polymixer.experiments.train import parallel
from polymixer.experiments.train.loop import TrainConfig

out, data, steps, stop, cp, fsdp = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), \
    sys.argv[6] == "1"
cfg = TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup=1, eval_every=100, ckpt_every=2, log_every=1, out=out,
                  progress=False, seed=3, stop_after=None if stop == "-" else int(stop), context_parallel=cp,
                  fsdp=fsdp, meta_init=True)  # (without --fsdp: the initial weights of the sharded runs)
res = train_lm("tiny-hybrid", cfg, [data], pack=False, eval_windows=4, n_layer=2, n_embd=32, n_head=2,
               block_size=32, window=8, sel_heads=2)
model = res["model"]
sd = parallel.full_model_state(model) if fsdp else {k: v for k, v in model.state_dict().items()
                                                    if k not in parallel.aliases(model)}
if res["rank"] == 0:
    torch.save({k: v.detach().cpu() for k, v in sd.items()}, f"{out}/weights.pt")
    json.dump([h["loss"] for h in res["history"] if "loss" in h], open(f"{out}/losses.json", "w"))
    json.dump(res["metrics"], open(f"{out}/metrics.json", "w"))
    from polymixer.ops.parallel import TOTAL
    json.dump(TOTAL, open(f"{out}/context_parallel.json", "w"))
"""


IMAGE_SCRIPT = r"""
import json, sys
import torch
from polymixer.experiments.image.task import train_image
from polymixer.experiments.train.loop import TrainConfig

out, cp = sys.argv[1], int(sys.argv[5])
cfg = TrainConfig(steps=2, batch_size=4, lr=1e-3, warmup=1, eval_every=100, ckpt_every=100, log_every=1, out=out,
                  progress=False, seed=3, context_parallel=cp)
res = train_image(PRESET, cfg, eval_samples=0, input_size=8, hidden_size=32, depth=2, position=POSITION)
if res["rank"] == 0:
    torch.save({k: v.detach().cpu() for k, v in res["model"].state_dict().items()}, f"{out}/weights.pt")
    json.dump([h["loss"] for h in res["history"] if "loss" in h], open(f"{out}/losses.json", "w"))
"""


def _run(tmp_path, corpus_dir, out, steps, procs=1, cp=1, fsdp=False, stop=None, script_text=SCRIPT):
    args = [out, corpus_dir, steps, "-" if stop is None else stop, cp, "1" if fsdp else "0"]
    torchrun(script_text, args, tmp_path, procs, name="scale_out.py")
    return torch.load(out / "weights.pt"), json.loads((out / "losses.json").read_text())


def test_context_parallel_step_equals_the_single_process_step_and_resumes(tmp_path, corpus_dir):
    one, losses_one = _run(tmp_path, corpus_dir, tmp_path / "one", 3)
    two, losses_two = _run(tmp_path, corpus_dir, tmp_path / "cp", 3, procs=2, cp=2)
    sent = json.loads((tmp_path / "cp" / "context_parallel.json").read_text())
    assert sent["calls"] > 0 and json.loads((tmp_path / "one" / "context_parallel.json").read_text())["calls"] == 0
    # the first step's loss is that of the same weights on the same batch
    assert abs(losses_two[0] - losses_one[0]) <= 1e-6 * abs(losses_one[0])
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-5, msg=k)
    # the final evaluation, each rank running half of every window, is the one-process evaluation's
    metrics_one, metrics_two = (json.loads((tmp_path / r / "metrics.json").read_text()) for r in ("one", "cp"))
    assert sorted(metrics_two) == sorted(metrics_one) == ["val_bpb", "val_loss"]
    for k, v in metrics_one.items():
        assert abs(metrics_two[k] - v) <= 1e-4 * abs(v), (k, metrics_two[k], v)
    # stopped after step 2 (a checkpoint), then resumed to 3: bit-exact with the uninterrupted context-parallel run
    _run(tmp_path, corpus_dir, tmp_path / "cp_stop", 3, procs=2, cp=2, stop=2)
    resumed, _ = _run(tmp_path, corpus_dir, tmp_path / "cp_stop", 3, procs=2, cp=2)
    for k in two:
        assert torch.equal(resumed[k], two[k]), k


def test_context_parallel_needs_a_family_that_splits_and_plain_windows(tmp_path, corpus_dir):
    from polymixer.experiments.lm.task import LMTask

    task = LMTask.__new__(LMTask)
    task.pack = True
    with pytest.raises(ValueError, match="add --no-pack"):
        task.split((torch.zeros(2, 8), torch.zeros(2, 8)), 0, 2)
    task.pack = False
    with pytest.raises(ValueError, match="must divide the context length"):
        task.split((torch.zeros(2, 9), torch.zeros(2, 9)), 0, 2)
    x, y = task.split((torch.arange(16).view(2, 8), torch.arange(16).view(2, 8)), 1, 2)
    assert x.tolist() == [[4, 5, 6, 7], [12, 13, 14, 15]] and torch.equal(x, y)


@pytest.mark.slow  # four, two and one processes of LM training: ~70 s on 2 cores
def test_fsdp_checkpoint_resumes_on_fewer_ranks_and_unsharded(tmp_path, corpus_dir):
    straight, _ = _run(tmp_path, corpus_dir, tmp_path / "straight", 3)
    four = tmp_path / "four"
    _run(tmp_path, corpus_dir, four, 2, procs=4, fsdp=True)
    for name, procs, fsdp in (("two", 2, True), ("one", 1, False)):
        run = tmp_path / name
        run.mkdir()
        subprocess.run(["cp", "-r", str(four / "checkpoints"), str(run / "checkpoints")], check=True)
        weights, _ = _run(tmp_path, corpus_dir, run, 3, procs=procs, fsdp=fsdp)
        for k in straight:
            torch.testing.assert_close(weights[k], straight[k], rtol=1e-4, atol=1e-5, msg=f"{name}: {k}")


@pytest.mark.slow  # the LM's context-parallel step runs by default; these are the image family's (~30 s each)
@pytest.mark.parametrize("procs, preset, position", [(2, "tiny-sit", "rope"), (2, "tiny-sipom", "sincos"),
                                                     (4, "tiny-sipom", "sincos_rope")])
def test_context_parallel_image_step_equals_the_single_process_step(tmp_path, corpus_dir, procs, preset, position):
    """The image family: each rank embeds its own band of patch rows (positions the band's global ones: 2-D sin-cos
    added, 2-D rotary, both), attention (tiny-sit) or PoM (tiny-sipom), on 2 ranks and on 4 (one row each)."""
    text = f"PRESET, POSITION = {preset!r}, {position!r}\n" + IMAGE_SCRIPT
    one, losses_one = _run(tmp_path, corpus_dir, tmp_path / "one", 2, script_text=text)
    two, losses_two = _run(tmp_path, corpus_dir, tmp_path / "cp", 2, procs=procs, cp=procs, script_text=text)
    assert abs(losses_two[0] - losses_one[0]) <= 1e-6 * abs(losses_one[0])
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-5, msg=k)


SLOW_EVAL_SCRIPT = r"""
import sys, time
from polymixer.experiments.lm import task as lm_task
from polymixer.experiments.lm.task import train_lm
from polymixer.experiments.train.loop import TrainConfig

slow = lm_task.LMTask.evaluate
def evaluate(self, model, step, out_dir):  # longer than --dist-timeout on every rank that evaluates
    time.sleep(9)
    return slow(self, model, step, out_dir)
lm_task.LMTask.evaluate = evaluate
out, data = sys.argv[1], sys.argv[2]
cfg = TrainConfig(steps=2, batch_size=4, lr=3e-3, warmup=1, eval_every=1, ckpt_every=100, log_every=1, out=out,
                  progress=False, seed=3, dist_timeout=0.1)
res = train_lm("tiny-pom", cfg, [data], pack=False, eval_windows=2, n_layer=1, n_embd=32, n_head=2, block_size=16)
if res["rank"] == 0:
    open(f"{out}/metrics.txt", "w").write(str(res["metrics"]))
"""


@pytest.mark.slow  # two 9 s evaluations on purpose (~25 s)
def test_an_evaluation_longer_than_the_timeout_leaves_no_rank_waiting(tmp_path, corpus_dir):
    """Every rank evaluates (the others into a scratch folder), so none waits in a collective while the first
    evaluates: a 9 s evaluation under a 6 s --dist-timeout finishes on 2 ranks."""
    torchrun(SLOW_EVAL_SCRIPT, [tmp_path / "run", corpus_dir], tmp_path, 2, name="slow_eval.py", timeout=300)
    assert "val_loss" in (tmp_path / "run" / "metrics.txt").read_text()
