"""Sharded checkpoints of FSDP2 runs (torchrun, gloo on CPU): every rank writes its own shard through
torch.distributed.checkpoint; a run saved on 2 or 4 ranks resumes bit-exactly on the same ranks and, resharded, on 2
and on 1 (plain) to the uninterrupted run's weights; a truncated or missing shard is named and the previous
checkpoint used; ``polymixer export checkpoint`` writes the one model.safetensors load_model reads; an asynchronous
save writes what the synchronous one writes; and no rank holds the whole state while it saves, loads or evaluates."""

from __future__ import annotations

import json
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from conftest import torchrun

from polymixer.checkpoint import (
    SHARDED, CheckpointWarning, begin_checkpoint, file_entries, load_model, publish_checkpoint, resolve_checkpoint,
    verify_checkpoint,
)

TRAIN = r"""
import json, sys
import torch
from polymixer.experiments.lm.task import train_lm
from polymixer.experiments.train import parallel
from polymixer.experiments.train.loop import TrainConfig

out, data, steps, stop, fsdp, background = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], \
    sys.argv[5] == "1", sys.argv[6] == "1"
cfg = TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup=1, eval_every=2, ckpt_every=2, log_every=1, out=out,
                  progress=False, seed=3, stop_after=None if stop == "-" else int(stop), fsdp=fsdp,
                  async_checkpoint=background, meta_init=True)  # (one process: the sharded runs' initial weights)
import torch.distributed.checkpoint as dcp
background_saves = []
_async_save = dcp.async_save
dcp.async_save = lambda *a, **k: (background_saves.append(1), _async_save(*a, **k))[1]
res = train_lm("tiny-hybrid", cfg, [data], pack=False, eval_windows=4, n_layer=2, n_embd=32, n_head=2,
               block_size=32, window=8, sel_heads=2)
model = res["model"]
sd = parallel.full_model_state(model) if fsdp else {k: v for k, v in model.state_dict().items()
                                                    if k not in parallel.aliases(model)}
if res["rank"] == 0:
    torch.save({k: v.detach().cpu() for k, v in sd.items()}, f"{out}/weights.pt")
    json.dump(res["metrics"], open(f"{out}/metrics.json", "w"))
    json.dump(len(background_saves), open(f"{out}/background_saves.json", "w"))
"""

MEMORY = r"""
import json, sys
from pathlib import Path
import torch, torch.distributed as dist
from polymixer.models import create_model
from polymixer.experiments.bench.common import peak_memory_mb
from polymixer.experiments.train import parallel
from polymixer.experiments.train.loop import TrainConfig, configure_optimizer

dist.init_process_group("gloo")
rank = dist.get_rank()
folder = Path(sys.argv[1])
cfg = TrainConfig(steps=2, lr=1e-3, out=str(folder))
mb = 2 ** 20


def build(meta):
    torch.manual_seed(0)
    m = create_model("tiny-hybrid", n_layer=8, n_embd=128, n_head=4, block_size=32, window=8, sel_heads=2)
    no_decay = parallel.no_decay_names(m)
    if meta:  # as a resumed run: nothing but this rank's shards is ever allocated
        buffers = parallel.to_meta(m)
        parallel.shard(m, False)
        parallel.materialise(m, torch.device("cpu"), buffers)
    else:
        parallel.shard(m, False)
    return m, configure_optimizer(m, cfg, no_decay)


def nbytes(ts):
    return sum(t.numel() * t.element_size() for t in ts)


model, opt = build(False)
x = torch.randint(0, 256, (2, 32))
out = model(x)
(out[0] if isinstance(out, tuple) else out).float().square().mean().backward()
opt.step()
opt.zero_grad()
blocks = [b for m in model.modules() if isinstance(m, torch.nn.ModuleList) for b in m]
row = {"rank": rank, "full_mb": 3 * nbytes(model.parameters()) / mb,  # weights + AdamW's two moments, whole
       "shard_mb": 3 * nbytes(p.to_local() for p in model.parameters()) / mb,
       "block_mb": max(nbytes(b.parameters()) for b in blocks) / mb,
       "root_mb": (nbytes(model.parameters()) - sum(nbytes(b.parameters()) for b in blocks)) / mb}
row["save_mb"] = peak_memory_mb(lambda: parallel.save_sharded(parallel.sharded_state(model, opt), folder / "s"))
row["gather_mb"] = peak_memory_mb(lambda: (parallel.full_model_state(model), parallel.full_optimizer_state(model, opt)))
model, opt = build(True)
row["load_mb"] = peak_memory_mb(lambda: parallel.load_sharded(model, opt, folder / "s"))


def evaluate():
    with torch.no_grad():
        model.eval()
        model(x)
        parallel.reshard(model)


row["eval_mb"] = peak_memory_mb(evaluate)
json.dump(row, open(folder / f"memory{rank}.json", "w"))
dist.destroy_process_group()
"""

SIGTERM = r"""
import os, signal, sys
import torch
from polymixer.experiments.train import parallel
from polymixer.experiments.train.loop import Preempted, TrainConfig, train

rank, out, kill = int(os.environ["RANK"]), sys.argv[1], sys.argv[2] == "1"


class Task:
    unit = "ex"

    def batch(self, step, share, shares, device):
        if kill and step == 6 and rank == 1:  # only rank 1 is told to stop, in the middle of step 7
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
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
cfg = TrainConfig(steps=10, batch_size=8, lr=1e-2, warmup=1, eval_every=1000, ckpt_every=5, out=out,
                  progress=False, fsdp=True, async_checkpoint=True)
try:
    train(model, Task(), cfg, {"family": "toy", "model": {}})
except Preempted as e:
    open(os.path.join(out, f"stopped_rank{rank}"), "w").write(str(e.step))
    raise
sd = parallel.full_model_state(model)
if rank == 0:
    torch.save(sd, os.path.join(out, "weights.pt"))
"""


def _launch(script_text: str, args: list, procs: int, tmp: Path, status: int = 0) -> subprocess.CompletedProcess:
    return torchrun(script_text, args, tmp, procs, env={"POLYMIXER_CACHE": str(tmp / "cache")}, status=status,
                    name=f"script_{abs(hash(script_text))}.py")


def _train(tmp: Path, corpus: Path, out: Path, steps: int, procs: int, fsdp: bool = True, stop=None,
           background: bool = False) -> dict:
    res = _launch(TRAIN, [out, corpus, steps, "-" if stop is None else stop, int(fsdp), int(background)], procs, tmp)
    weights = torch.load(out / "weights.pt")
    weights["_stderr"] = res.stderr
    return weights


def _same(a: dict, b: dict, tol: float = 0.0, what: str = "") -> None:
    keys = [k for k in b if not k.startswith("_")]
    assert sorted(k for k in a if not k.startswith("_")) == sorted(keys)
    for k in keys:
        if tol == 0:
            assert torch.equal(a[k], b[k]), f"{what}: {k}"
        else:
            assert (a[k] - b[k]).abs().max().item() <= tol, f"{what}: {k} differs by {(a[k] - b[k]).abs().max()}"


def _copy_run(src: Path, dst: Path, step: int) -> Path:
    """A run folder holding only ``src``'s checkpoint of ``step`` (as a resumed job would find it)."""
    (dst / "checkpoints").mkdir(parents=True)
    name = f"step_{step:08d}"
    shutil.copytree(src / "checkpoints" / name, dst / "checkpoints" / name)
    (dst / "checkpoints" / "latest").write_text(name)
    return dst


@pytest.fixture(scope="module")
def two(tmp_path_factory, corpus_dir):
    """2-rank FSDP runs of 4 steps (checkpoints at 2 and 4): uninterrupted; stopped after 2 then resumed."""
    tmp = tmp_path_factory.mktemp("two")
    straight = _train(tmp, corpus_dir, tmp / "straight", 4, 2)
    _train(tmp, corpus_dir, tmp / "stopped", 4, 2, stop=2)
    resumed = _train(tmp, corpus_dir, tmp / "stopped", 4, 2)
    return {"tmp": tmp, "corpus": corpus_dir, "straight": straight, "resumed": resumed}


def test_a_sharded_checkpoint_holds_one_shard_per_rank_in_its_manifest(two):
    ck = two["tmp"] / "straight" / "checkpoints" / "step_00000002"
    # (the evaluation of step 2 ran after the checkpoint was published: its metrics beside it, outside the manifest)
    assert sorted(p.name for p in ck.iterdir()) == ["config.json", "evaluation.json", "manifest.json", SHARDED,
                                                    "trainer.pt"]
    assert sorted(p.name for p in (ck / SHARDED).iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    listed = json.loads((ck / "manifest.json").read_text())["files"]
    assert sorted(listed) == ["config.json", f"{SHARDED}/.metadata", f"{SHARDED}/__0_0.distcp",
                              f"{SHARDED}/__1_0.distcp", "trainer.pt"]
    # the checksums the ranks computed of their own shards are those of the files
    assert file_entries(ck, list(listed)) == listed and verify_checkpoint(ck) is None
    state = torch.load(ck / "trainer.pt", weights_only=True)
    assert state["step"] == 2 and state["optimizer_format"] == "dcp" and "optimizer" not in state
    assert len(state["rng"]) == 2  # every rank's generators


def test_a_sharded_run_resumes_bit_exact_on_the_same_ranks(two):
    _same(two["resumed"], two["straight"], what="resumed on 2")


def test_sharded_evaluation_equals_the_unsharded_one(two, tmp_path):
    """Every rank evaluates the sharded model (no whole copy): the metrics are those of a one-process run's."""
    _train(tmp_path, two["corpus"], tmp_path / "one", 4, 1, fsdp=False)
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    sharded = json.loads((two["tmp"] / "straight" / "metrics.json").read_text())
    assert sorted(one) == sorted(sharded) and one
    for k in one:
        assert abs(one[k] - sharded[k]) <= 1e-5 * max(1.0, abs(one[k])), k


def test_a_truncated_shard_falls_back_to_the_previous_checkpoint(two, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two["tmp"] / "straight" / "checkpoints", run / "checkpoints")
    shard = run / "checkpoints" / "step_00000004" / SHARDED / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    res = _train(tmp_path, two["corpus"], run, 4, 2)  # resumes from step 2 and trains steps 3 and 4 again
    assert f"skipping checkpoint step_00000004: {shard}: " in res["_stderr"]
    assert "truncated" in res["_stderr"]
    _same(res, two["straight"], what="after the fallback")


def test_export_writes_the_single_file_checkpoint_load_model_reads(two, tmp_path):
    from polymixer.experiments.cli import main

    assert main(["export", "checkpoint", str(two["tmp"] / "straight"), "--out", str(tmp_path / "exported")]) == 0
    exported = tmp_path / "exported"
    assert sorted(p.name for p in exported.iterdir()) == ["config.json", "manifest.json", "model.safetensors"]
    assert verify_checkpoint(exported) is None
    model = load_model(exported)
    _same({k: v for k, v in model.state_dict().items() if k in two["straight"]}, two["straight"], what="export")
    direct = load_model(two["tmp"] / "straight")  # load_model reads a sharded checkpoint itself too
    assert all(torch.equal(direct.state_dict()[k], v) for k, v in model.state_dict().items())
    assert main(["export", "checkpoint", str(two["tmp"] / "straight"), "--out", str(exported)]) == 2  # not empty
    from polymixer.checkpoint import load_weights
    from polymixer.models import create_model

    other = create_model("tiny-hybrid", n_layer=4, n_embd=32, n_head=2, block_size=32, window=8, sel_heads=2)
    with pytest.raises(ValueError, match=r"does not fit this model: missing \['blocks.2.*, unexpected \[\]"):
        load_weights(other, two["tmp"] / "straight")


def test_async_checkpoint_needs_fsdp():
    from polymixer.experiments.train.loop import TrainConfig

    with pytest.raises(ValueError, match="--async-checkpoint .* needs --fsdp"):
        TrainConfig(async_checkpoint=True)


def test_an_asynchronous_save_writes_what_the_synchronous_one_writes(two, tmp_path):
    background = _train(tmp_path, two["corpus"], tmp_path / "async", 4, 2, background=True)
    _same(background, two["straight"], what="async run")
    for step in (2, 4):
        ck = tmp_path / "async" / "checkpoints" / f"step_{step:08d}"
        assert verify_checkpoint(ck) is None
        a, s = load_model(ck), load_model(two["tmp"] / "straight" / "checkpoints" / ck.name)
        _same(a.state_dict(), s.state_dict(), what=f"checkpoint {step}")
        assert torch.load(ck / "trainer.pt", weights_only=True)["step"] == step
    assert (tmp_path / "async" / "checkpoints" / "latest").read_text() == "step_00000004"
    assert json.loads((tmp_path / "async" / "background_saves.json").read_text()) == 2  # dcp.async_save wrote both
    assert not list((tmp_path / "async" / "checkpoints").glob(".*tmp*"))  # nothing left half-published


@pytest.mark.slow  # ten runs of 1 to 4 processes: ~3 min on 2 cores
def test_saved_on_four_ranks_resumes_on_four_two_and_one(tmp_path, corpus_dir):
    straight = _train(tmp_path, corpus_dir, tmp_path / "straight", 4, 4)
    _train(tmp_path, corpus_dir, tmp_path / "stopped", 4, 4, stop=2)
    saved = tmp_path / "stopped" / "checkpoints" / "step_00000002"
    assert sorted(p.name for p in (saved / SHARDED).glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    for procs, fsdp in ((4, True), (2, True), (1, False)):
        run = _copy_run(tmp_path / "stopped", tmp_path / f"on{procs}", 2)
        # resumed at its end: the weights loaded, resharded (or whole), equal those saved, bit for bit
        loaded = _train(tmp_path, corpus_dir, run, 2, procs, fsdp=fsdp)
        _same({k: v for k, v in load_model(saved).state_dict().items() if k in loaded}, loaded, what=f"on {procs}")
        resumed = _train(tmp_path, corpus_dir, run, 4, procs, fsdp=fsdp)
        # the same ranks: bit-exact; others: the sums of the gradients run in another order
        _same(resumed, straight, tol=0.0 if procs == 4 else 1e-6, what=f"resumed on {procs}")


def test_a_damaged_or_missing_shard_is_named_and_the_previous_checkpoint_used(tmp_path):
    """The library's part alone: a folder of shard files (as every rank writes them) published with their
    checksums; one shard truncated, then one missing, and resolving the run names it and takes the older one."""
    run = tmp_path / "run"
    for step in (1, 2):
        tmp = begin_checkpoint(run, step)
        (tmp / SHARDED).mkdir()
        for r in range(3):
            (tmp / SHARDED / f"__{r}_0.distcp").write_bytes(bytes([step, r]) * 1000)
        entries = file_entries(tmp, [f"{SHARDED}/__{r}_0.distcp" for r in range(3)])
        publish_checkpoint(tmp, run, step, {"family": "lm"}, {"step": step}, entries=entries)
    newest = run / "checkpoints" / "step_00000002"
    assert resolve_checkpoint(run) == newest
    shard = newest / SHARDED / "__2_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve_checkpoint(run).name == "step_00000001"
    assert any(w.category is CheckpointWarning and f"{shard}: 100 bytes" in str(w.message) for w in caught)
    shard.unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve_checkpoint(run).name == "step_00000001"
    assert any(f"{shard}: missing" in str(w.message) for w in caught)
    # several processes verifying together (each a share of the checksums) agree on the same verdict
    found = [verify_checkpoint(run / "checkpoints" / "step_00000001", share=(i, 3)) for i in range(3)]
    assert found == [None, None, None]
    assert verify_checkpoint(newest, share=(0, 3), agree=lambda p: p) == f"{shard}: missing"


@pytest.mark.parametrize("procs", [2, pytest.param(4, marks=pytest.mark.slow)])  # (4 ranks: ~40 s)
def test_no_rank_holds_the_whole_state_to_save_load_or_evaluate(tmp_path, procs):
    """Peak tensor memory per rank (PyTorch's allocations, replayed from the profiler) of an 8-block LM's sharded
    save, of its load into a model built on the meta device, and of a forward of the sharded model: the save copies
    less than one block, the load allocates this rank's shards (optimizer state included) plus at most one block,
    the forward a few blocks' gathered parameters (gloo's all-gather copies each block's about three times) — never
    the whole state. The whole-state gather of earlier checkpoints, measured alike, shows what the meter would see."""
    _launch(MEMORY, [tmp_path], procs, tmp_path)
    rows = [json.loads((tmp_path / f"memory{r}.json").read_text()) for r in range(procs)]
    for row in rows:
        shard, block, full = row["shard_mb"], row["block_mb"], row["full_mb"]
        assert shard <= full / procs * 1.05 + block, row
        assert row["save_mb"] <= block + 0.1 * shard, row  # DCP's own buffers: about one block's size at most
        assert row["load_mb"] <= shard + block, row
        assert row["eval_mb"] <= 4 * block + row["root_mb"] + 0.5, row  # + activations of 2 × 32 tokens
        # well under the weights alone (8 blocks): 2.4 MB of 6.2 alone; under load (xdist) one more gathered block
        # may still be alive when the next is prefetched (3.2 MB seen), which the block bound above allows
        assert row["eval_mb"] <= full / 3 * 2 / 3, row
    assert rows[0]["gather_mb"] >= 0.95 * rows[0]["full_mb"]  # what a whole-state checkpoint costs the first rank


@pytest.mark.slow  # a run, a signal and a resume on 2 ranks (~22 s)
def test_sigterm_with_a_background_save_in_flight_publishes_it_exits_75_and_resumes_bit_exact(tmp_path):
    """--async-checkpoint: the save of step 5 is not yet published when SIGTERM reaches one rank during step 7; every
    rank stops after step 7, both checkpoints are published complete, the workers exit 75, and the resumed run ends
    with the uninterrupted run's weights."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    for out in (straight, stopped):
        out.mkdir()
    _launch(SIGTERM, [straight, 0], 2, tmp_path)
    res = _launch(SIGTERM, [stopped, 1], 2, tmp_path, status=1)  # torchrun: a worker failed (with status 75)
    assert "exitcode  : 75" in res.stderr
    assert [(stopped / f"stopped_rank{r}").read_text() for r in (0, 1)] == ["7", "7"]
    root = stopped / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000005", "step_00000007"]
    assert all(verify_checkpoint(p) is None for p in root.glob("step_*"))
    assert (root / "latest").read_text() == "step_00000007"
    _launch(SIGTERM, [stopped, 0], 2, tmp_path)
    a, b = torch.load(stopped / "weights.pt"), torch.load(straight / "weights.pt")
    _same(a, b, what="resumed after SIGTERM")
