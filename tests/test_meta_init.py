"""Block-wise initialisation of a model built on the meta device (every fresh ``--fsdp`` run of a family that builds
from a preset): each family's own initialisation reproduced unit by unit (its constants exactly, its random tensors
in distribution), a tensor no initialisation reaches named in one line; sharded on 2 ranks, the same weights as on
one process, twice the same, each rank's peak memory while initialising at most its shards plus one unit; and FSDP
runs of two families train from it."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import rank_results, torchrun
from torch import nn

from polymixer.experiments.train.parallel import init_blockwise, units
from polymixer.models import create_model, list_models

SPECS = [(n, {}) for n in list_models() if n.startswith("tiny-")]
SPECS += [(f"mqar-{k}", {"token_shift": True}) for k in ("attention", "based", "linear", "pom", "swa", "vpom")]
SPECS += [("tiny-hybrid", {"attention_shift": 2, "n_layer": 2}), ("tiny-pom", {"mixer": "G", "n_layer": 2})]


def _state(name, kw, seed=None, meta=False):
    if meta:
        model = create_model(name, device="meta", **kw)
        init_blockwise(model, copy.deepcopy(model), seed, torch.device("cpu"))
        return model
    torch.manual_seed(seed)
    return create_model(name, **kw)


@pytest.mark.parametrize("name, kw", SPECS, ids=[f"{n}{'+' if kw else ''}{','.join(kw)}" for n, kw in SPECS])
def test_blockwise_init_follows_the_models_own_initialisation(name, kw):
    """Against building the model whole (seeds 0 and 1): what both seeds agree on (zeros, ones, the token shifts'
    0.5, sin-cos positions, batch-norm statistics) is equal; every random tensor has the spread of the model's own
    draws; the same seed gives the same weights, another seed others."""
    a, b = _state(name, kw, 0).state_dict(), _state(name, kw, 1).state_dict()
    m = _state(name, kw, 0, meta=True)
    got = m.state_dict()
    assert list(got) == list(a)
    assert m.get_parameter(next(iter(dict(m.named_parameters())))).device.type == "cpu"
    for k, x in a.items():
        if torch.equal(x, b[k]):
            assert torch.equal(got[k], x), k
        elif x.numel() >= 32:
            spread, want = got[k].float().std().item(), x.float().std().item()
            assert abs(spread - want) <= (0.2 if x.numel() >= 256 else 0.5) * want, (k, spread, want)
        else:  # (too few draws for a spread: within the range of the model's own)
            assert got[k].abs().max() <= 2 * torch.maximum(x.abs().max(), b[k].abs().max()), k
    again, other = _state(name, kw, 0, meta=True).state_dict(), _state(name, kw, 1, meta=True).state_dict()
    assert all(torch.equal(again[k], v) for k, v in got.items())
    assert any(not torch.equal(other[k], v) for k, v in got.items())


def test_ties_and_the_callers_generators_are_kept():
    model = create_model("tiny-pom", device="meta", n_layer=2)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    init_blockwise(model, copy.deepcopy(model), 0, torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected)  # (the initialisation drew from a stream of its own)
    assert model.lm_head.weight is model.wte.weight
    assert units(model) == ["blocks.0", "blocks.1", ""]


class _Uncovered(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(2, 2)])
        self.gain = nn.Parameter(torch.randn(3))  # drawn in the constructor alone: no reset_parameters sets it


def test_a_tensor_no_initialisation_reaches_is_named():
    with torch.device("meta"):
        model = _Uncovered()
    with pytest.raises(ValueError, match="^gain is set by no reset_parameters of its module nor by the model's "
                                         "initialize_weights: the model cannot be initialised on the meta device$"):
        init_blockwise(model, copy.deepcopy(model), 0, torch.device("cpu"))


SHARDED = r"""
import copy, json, os, sys
import torch, torch.distributed as dist
from polymixer.models import create_model
from polymixer.experiments.bench.common import peak_memory_mb
from polymixer.experiments.train import parallel

dist.init_process_group("gloo")
rank, out = dist.get_rank(), sys.argv[1]
mb = 2 ** 20


def nbytes(ts):
    return sum(t.numel() * t.element_size() for t in ts)


def build():
    model = create_model("tiny-hybrid", device="meta", n_layer=8, n_embd=128, n_head=4, block_size=32, window=8,
                         sel_heads=2)
    template = copy.deepcopy(model)
    parallel.shard(model, False)
    peak = peak_memory_mb(lambda: parallel.init_blockwise(model, template, 3, torch.device("cpu")))
    return model, template, peak


model, template, peak = build()
shards = {n: p.to_local().clone() for n, p in model.named_parameters()}
again, _, _ = build()
same = all(torch.equal(p.to_local(), shards[n]) for n, p in again.named_parameters())
blocks = [nbytes(template.get_submodule(u).parameters()) for u in parallel.units(template) if u]
whole = nbytes(template.parameters())
world = dist.get_world_size()
padded = sum(-(-p.shape[0] // world) * p[0].numel() * p.element_size() for p in template.parameters())
row = {"init_mb": peak, "shard_mb": padded / mb,  # (FSDP2 pads each shard to ⌈rows / ranks⌉ rows)
       "unit_mb": max(blocks + [whole - sum(blocks)]) / mb, "full_mb": whole / mb, "same_twice": same}
full = parallel.full_model_state(model)
if rank == 0:
    torch.save(full, os.path.join(out, "full.pt"))
report(row)
"""


def test_sharded_initialisation_is_the_one_process_one_and_holds_a_shard_plus_one_unit(tmp_path):
    torchrun(SHARDED, [tmp_path], tmp_path, 2, name="sharded_init.py")
    rows = rank_results(tmp_path, 2)
    for row in rows:
        assert row["same_twice"], row
        assert row["shard_mb"] <= row["full_mb"] / 2 * 1.05, row
        # never the whole model: the shards, one unit whole, and the generator state fork_rng keeps (5 kB)
        assert row["init_mb"] <= row["shard_mb"] + row["unit_mb"] + 0.01, row
        assert row["init_mb"] < 0.65 * row["full_mb"], row  # (8 blocks: a shard is half the model, a block 1/8)
    print("peak MB per rank while initialising:", json.dumps(rows))
    one = _state("tiny-hybrid", dict(n_layer=8, n_embd=128, n_head=4, block_size=32, window=8, sel_heads=2), 3,
                 meta=True).state_dict()
    full = torch.load(tmp_path / "full.pt")
    assert sorted(full) == sorted(k for k in one if k != "lm_head.weight")
    for k, v in full.items():
        assert torch.equal(v, one[k]), k


TRAINS = r"""
import json, os, sys
import torch
from polymixer.experiments.train.loop import TrainConfig

from polymixer.experiments.train import parallel

family, out = sys.argv[1], sys.argv[2]
calls = []
_init = parallel.init_blockwise
parallel.init_blockwise = lambda *a: (calls.append(1), _init(*a))[1]
cfg = TrainConfig(steps=6, batch_size=4, lr=3e-3, warmup=1, eval_every=100, ckpt_every=100, log_every=1, out=out,
                  progress=False, curves=False, seed=3, fsdp=True)
if family == "lm":
    from polymixer.experiments.lm.task import train_lm
    res = train_lm("tiny-pom", cfg, [sys.argv[3]], pack=False, eval_windows=2, n_layer=2, n_embd=32, n_head=2,
                   block_size=32, sel_heads=2)
else:
    from polymixer.experiments.image.task import train_image
    res = train_image("tiny-sipom", cfg, eval_samples=0, input_size=8, hidden_size=32, depth=2)
assert calls == [1]  # built on the meta device, each rank's shards initialised block by block
if res["rank"] == 0:
    json.dump([h["loss"] for h in res["history"] if "loss" in h], open(os.path.join(out, "losses.json"), "w"))
"""


@pytest.mark.parametrize("family", ["lm", "image"])
def test_a_fresh_fsdp_run_built_on_the_meta_device_trains(tmp_path, corpus_dir, family):
    out = tmp_path / "run"
    torchrun(TRAINS, [family, out, corpus_dir], tmp_path, 2, env={"POLYMIXER_CACHE": str(tmp_path / "cache")},
             name="fsdp_meta.py")
    losses = json.loads((out / "losses.json").read_text())
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < losses[0], losses


WHOLE = r"""
import sys
import torch
from polymixer.experiments.lm.task import train_lm
from polymixer.experiments.train import parallel
from polymixer.experiments.train.loop import TrainConfig

out, data, steps, stop, fsdp = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
cfg = TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup=1, eval_every=100, ckpt_every=2, log_every=1, out=out,
                  progress=False, curves=False, seed=3, stop_after=None if stop == "-" else int(stop), fsdp=fsdp,
                  meta_init=True)
res = train_lm("tiny-pom", cfg, [data], pack=False, eval_windows=2, n_layer=2, n_embd=32, n_head=2, block_size=32,
               sel_heads=2)
model = res["model"]
sd = parallel.full_model_state(model) if fsdp else dict(model.state_dict())
if res["rank"] == 0:
    torch.save({k: v.detach().cpu() for k, v in sd.items() if k not in parallel.aliases(model)}, f"{out}/weights.pt")
"""


def test_a_checkpoint_of_whole_tensors_resumes_under_fsdp_from_the_meta_device(tmp_path, corpus_dir):
    """A one-process run's checkpoint (whole tensors) resumed by a fresh --fsdp job on 2 ranks, whose model is built
    on the meta device: materialised whole, loaded, sharded — it ends where the uninterrupted run ends."""
    env = {"POLYMIXER_CACHE": str(tmp_path / "cache")}

    def run(out, steps, stop, procs, fsdp):
        torchrun(WHOLE, [out, corpus_dir, steps, stop, int(fsdp)], tmp_path, procs, env=env, name="whole.py")
        return torch.load(out / "weights.pt")

    straight = run(tmp_path / "straight", 4, "-", 1, False)
    run(tmp_path / "run", 4, 2, 1, False)
    resumed = run(tmp_path / "run", 4, "-", 2, True)
    assert sorted(resumed) == sorted(straight)
    for k, v in straight.items():
        torch.testing.assert_close(resumed[k], v, rtol=1e-4, atol=1e-5, msg=k)
