"""The context-parallel transfers themselves (:mod:`polymixer.ops.parallel`) on 2–8 gloo CPU processes: the rank
scans, the block-causal carry and the halo against sums written out literally, their gradients against the
transposed sums; the bytes a PoM / value-PoM layer sends per rank against P (full mixing an all-reduce, causal
O(log P)); and no host read inside a layer under a context that knows its slices."""

from __future__ import annotations

import pytest
from conftest import rank_results, torchrun

SCRIPT = r'''
import torch
import torch.distributed as dist
import polymixer
from polymixer.ops import parallel as par

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
out = {"scan": [], "carry": [], "halo": []}
gen = torch.Generator().manual_seed(7)
xs = torch.randn(world, 3, 5, dtype=torch.float64, generator=gen)  # every rank's input, known to all
gs = torch.randn(world, 3, 5, dtype=torch.float64, generator=gen)  # every rank's output gradient


def err(a, b):
    return float((a - b).abs().max())


def tail_ranks(sl, block):
    """The later ranks whose first tokens belong to the block of this rank's last token, walked rank by rank."""
    starts, out = [sum(sl.lengths[:r]) for r in range(len(sl.lengths))], []
    for r in range(sl.rank + 1, len(sl.lengths)):
        if starts[r] // block != (sl.start + sl.length - 1) // block:
            break
        out.append(r)
    return out


with polymixer.context_parallel(lengths=[2] * world, check="none") as cp:
    x = xs[rank].clone().requires_grad_(True)
    y = par.exclusive_scan(x, cp)
    (y * gs[rank]).sum().backward()
    out["scan"] = [err(y, xs[:rank].sum(0)), err(x.grad, gs[rank + 1:].sum(0))]
    total = par.all_reduce_sum(xs[rank].clone().requires_grad_(True), cp)
    out["all_reduce"] = err(total, xs.sum(0))

for lengths, K in (([2] * world, 3), ([1] * world, 4), ([3, 1, 1, 4, 1, 2, 5, 1][:world], 4),
                   ([5, 1, 11, 2, 2, 3, 1, 1][:world], 16), ([4] * world, 4)):
    with polymixer.context_parallel(lengths=lengths, check="none") as cp:
        sl = cp.slice_of(lengths[rank])
        local = xs[rank].clone().requires_grad_(True)
        head = (xs[rank] * 0.5).clone().requires_grad_(True)
        prefix, tail = par.block_carry(local, head, sl, K, cp)
        ((prefix * gs[rank]).sum() + (tail * gs[rank] * 3).sum()).backward()
        ranks = tail_ranks(sl, K)
        want_tail = sum((xs[s] * 0.5 for s in ranks), torch.zeros(3, 5, dtype=torch.float64))
        readers = [r for r in range(world) if rank in tail_ranks(par.Slice(r, lengths), K)]
        want_dhead = sum((gs[r] * 3 * 0.5 * 2 for r in readers), torch.zeros(3, 5, dtype=torch.float64))
        out["carry"].append([err(prefix, xs[:rank].sum(0)), err(tail, want_tail), err(local.grad, gs[rank + 1:].sum(0)),
                             err(head.grad * 0.5 * 2, want_dhead), len(ranks)])
    for lags in (1, 3, 6):  # the halo: the lags rows before this slice, across as many slices as it takes
        seq = torch.randn(2, sum(lengths), 4, dtype=torch.float64, generator=gen)
        gseq = torch.randn(2, lags, 4, dtype=torch.float64, generator=gen)
        with polymixer.context_parallel(lengths=lengths, check="none") as cp:
            sl = cp.slice_of(lengths[rank])
            mine = seq[:, sl.start:sl.start + sl.length].clone().requires_grad_(True)
            before = par.halo_before(mine[:, -min(lags, sl.length):], lags, sl, cp, "halo")
            want = torch.nn.functional.pad(seq, (0, 0, lags, 0))[:, sl.start:sl.start + lags]
            (before * gseq).sum().backward()
        # the gradient of this slice's rows: what every later slice's halo read from them (the same gseq on every
        # rank: one generator, drawn alike)
        want_grad = torch.zeros_like(mine)
        for r in range(rank + 1, world):
            s_r = sum(lengths[:r])
            for j in range(lags):
                t = s_r - lags + j - sl.start
                if 0 <= t < sl.length:
                    want_grad[:, t] += gseq[:, j]
        out["halo"].append(err(mine.grad, want_grad))
        out["halo"].append(err(before, want))

# bytes per rank of one layer call, forward + backward, in each mode
from polymixer import PoM, ValuePoM
sent = {}
for name, module, kw in (("pom full", PoM(64, expand=2), {}), ("pom causal", PoM(64, expand=2), {"causal": True}),
                         ("pom block", PoM(64, expand=2), {"causal": True, "block_size": 8}),
                         ("value full", ValuePoM(64, value_dim=64, heads=4), {}),
                         ("value causal", ValuePoM(64, value_dim=64, heads=4), {"causal": True}),
                         ("value causal shift", ValuePoM(64, value_dim=64, heads=4, token_shift=4), {"causal": True})):
    for n in (16, 64):
        x = torch.randn(2, n, 64, requires_grad=True)
        with polymixer.context_parallel(lengths=[n] * world, check="none") as cp:
            module(x, **kw).square().mean().backward()
        sent[f"{name} {n}"] = cp.bytes_sent

# no host read inside a layer: every way a tensor reaches the host raises
def refuse(*a, **k):
    raise RuntimeError("a host read inside the layer")
saved = {k: getattr(torch.Tensor, k) for k in ("item", "tolist", "__bool__", "__int__", "__float__")}
syncs = {}
for name, module, kw in (("pom causal", PoM(16, rope="1d"), {"causal": True}),
                         ("pom block", PoM(16), {"causal": True, "block_size": 3}),
                         ("pom full", PoM(16), {}),
                         ("value causal shift", ValuePoM(16, value_dim=16, heads=2, token_shift=3), {"causal": True}),
                         ("value block", ValuePoM(16, value_dim=16, heads=2), {"causal": True, "block_size": 3})):
    x = torch.randn(2, 5, 16, requires_grad=True)
    try:
        with polymixer.context_parallel(lengths=[5] * world, check="none"):
            for k in saved:
                setattr(torch.Tensor, k, refuse)
            try:
                module(x, **kw).square().mean().backward()
            finally:
                for k, f in saved.items():
                    setattr(torch.Tensor, k, f)
        syncs[name] = None
    except RuntimeError as e:
        syncs[name] = str(e)
out["sent"], out["syncs"] = sent, syncs
report(out)
dist.destroy_process_group()
'''


def _run(tmp_path, world: int) -> list:
    torchrun(SCRIPT, [], tmp_path, world, name="collectives.py")
    return rank_results(tmp_path, world)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    # recursive doubling at 3, the tree at 2 and 8
    return {P: _run(tmp_path_factory.mktemp(f"p{P}"), P) for P in (2, 3, 8)}


def test_scans_carry_and_halo_equal_the_literal_sums_and_their_transposes(worlds):
    for P, results in worlds.items():
        for rank, out in enumerate(results):
            assert max(out["scan"]) < 1e-12 and out["all_reduce"] < 1e-12, (P, rank, out["scan"])
            for case in out["carry"]:
                assert max(case[:4]) < 1e-12, (P, rank, case)
            assert max(out["halo"]) < 1e-12, (P, rank, out["halo"])
    # the segmented scan crossed more than one rank somewhere (a block holding several whole slices)
    assert any(case[4] >= 2 for out in worlds[8] for case in out["carry"])


def test_no_host_read_inside_a_layer(worlds):
    for P, results in worlds.items():
        for out in results:
            assert all(v is None for v in out["syncs"].values()), (P, out["syncs"])


def _per_rank(results, name: str):
    sent = [out["sent"][name] for out in results]
    return sum(sent) / len(sent), max(sent)


def test_bytes_per_rank_flat_in_n_and_log_in_p(worlds):
    for P, results in worlds.items():
        for out in results:
            for name in ("pom full", "pom causal", "pom block", "value causal", "value causal shift"):
                assert out["sent"][f"{name} 16"] == out["sent"][f"{name} 64"], (P, name)  # flat in N
    for name in ("pom causal", "value causal"):
        mean2, _ = _per_rank(worlds[2], f"{name} 64")
        mean8, max8 = _per_rank(worlds[8], f"{name} 64")
        assert mean8 <= 3.5 * mean2, (name, mean8 / mean2)  # ~P log P with an all-gather: 8.5×
        assert max8 <= 5 * mean2  # the busiest rank: 2 log₂ P − 1 transfers of one state
    for name in ("pom full", "value full"):  # an all-reduce: 2 (P − 1) / P of the state each way, below 2× at any P
        mean2, _ = _per_rank(worlds[2], f"{name} 64")
        mean8, _ = _per_rank(worlds[8], f"{name} 64")
        assert mean8 <= 1.75 * mean2 + 1e-9, (name, mean8 / mean2)


def test_bench_scaling_counts_equal_its_model(tmp_path):
    from polymixer.experiments.bench.parallel import ScalingConfig, scaling, scaling_report

    cfg = ScalingConfig(dim=16, value_dim=16, heads=2, tokens_per_rank=4, block_size=6, ranks=(2, 4),
                        model_ranks=(8, 1024), out=str(tmp_path))
    payload = scaling(cfg, progress=False)
    for row in payload["counted"]:
        if row["mode"] == "block-causal":  # the model bounds the block's tail by one hop
            assert row["mean_bytes"] <= row["model_bytes"] + 1e-9, row
        else:
            assert abs(row["mean_bytes"] - row["model_bytes"]) < 1e-6, row
    model = {(r["kind"], r["mode"], r["P"]): r for r in payload["model"]}
    for kind in ("pom", "value_pom"):  # flat in P, where the all-gather grew as P
        assert model[(kind, "causal", 1024)]["bytes"] < 2 * model[(kind, "causal", 8)]["bytes"]
        assert model[(kind, "full", 1024)]["allgather_bytes"] > 100 * model[(kind, "full", 1024)]["bytes"]
    assert "MODEL, not measured" in scaling_report(payload)
    assert (tmp_path / "parallel_scaling.json").is_file()
