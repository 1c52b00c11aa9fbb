"""Activation checkpointing (``--activation-checkpointing block | selective``): every family's gradients, losses and
running statistics equal those without it; parameter names and checkpoints are unchanged (an AC run resumes
without AC bit-exactly); it composes with torch.compile, with context parallelism (the mixers' collectives run
again in the recomputation, on every rank alike; a block run locally inside the context is recomputed locally) and
with FSDP2; a 4-block model's forward + backward peaks at ≤ 0.5× the memory without it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import rank_results, torchrun
from torch import nn

from polymixer import PoM, PolyMorpher
from polymixer.models import create_model
from polymixer.experiments.train.memory import MODES, apply_activation_checkpointing, blocks_of, checkpointed_mode
from polymixer.experiments.train.loop import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def _lm():
    m = create_model("tiny-hybrid", n_layer=4, n_embd=32, n_head=2, block_size=32, window=8, sel_heads=2,
                     dropout=0.1)
    idx = torch.randint(0, m.config.vocab_size, (2, 32))
    return m, lambda mod: mod(idx, idx)[1]


def _image():
    m = create_model("tiny-sipom-vhybrid", input_size=8, hidden_size=32, depth=2)
    with torch.no_grad():  # (adaLN-zero: a fresh model's output is 0 and most of its gradients too)
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x, t = torch.randn(2, m.config.in_channels, 8, 8), torch.rand(2)
    y = torch.randint(0, m.config.num_classes, (2,))
    return m, lambda mod: mod(x, t, y).square().mean()


def _ocr():  # batch norms in the stem's blocks: their running statistics must advance once per forward
    m = create_model("tiny-htr-vpom", dim=32, heads=2, stem_channels=(8, 16, 32), depth=2, sel_heads=2)
    x, widths = torch.randn(2, 1, 32, 128), torch.tensor([128, 90])
    return m, lambda mod: mod(x, widths)[0].square().mean()


def _eo():
    m = create_model("tiny-tsvipom-hybrid", dim=16, heads=2, temporal_depth=2, spatial_depth=2, sel_heads=2,
                     image_size=8, num_classes=5)
    x, doy = torch.randn(2, 4, 8, 8, 10), torch.randint(0, 366, (2, 4))
    return m, lambda mod: mod(x, doy).square().mean()


def _points():  # blocks inside stages (a list of lists): the blocks are wrapped; drop-path replays its draws
    small = dict(enc_depths=(1, 1, 2), enc_channels=(8, 16, 16), enc_heads=(1, 2, 2), dec_depths=(1, 1),
                 dec_channels=(8, 16), dec_heads=(1, 2), patch_size=24, drop_path=0.2, in_channels=6, num_classes=5)
    m = create_model("tiny-ppomv3", **small)
    g = torch.Generator().manual_seed(0)
    grids = [torch.unique(torch.randint(0, side, (n, 3), generator=g), dim=0) for n, side in ((300, 9), (200, 8))]
    grid = torch.cat(grids)
    feat = torch.randn(len(grid), 6, generator=g)
    offset = torch.tensor([len(x) for x in grids]).cumsum(0)
    return m, lambda mod: mod(feat, grid, offset).square().mean()


def _recall():
    m = create_model("mqar-pom")
    idx = torch.randint(0, m.config.vocab_size, (2, 64))
    return m, lambda mod: mod(idx, idx)[1]


def _distill():  # stage 1 trains a bank of mixers (an nn.ModuleDict) on the teacher's layer inputs
    from polymixer.experiments.distill.task import MixerBank

    bank = MixerBank({0: PoM(16), 2: PoM(16, rope="1d")})
    calls = {i: [((torch.randn(2, 24, 16),), {"causal": True}, torch.randn(2, 24, 16))] for i in (0, 2)}
    return bank, lambda mod: mod(calls)


def _distill_hf():  # stage 2 of a transformers student: its decoder layers (an nn.ModuleList) are the blocks
    tf = pytest.importorskip("transformers")
    from polymixer.experiments.distill.task import CausalLMView

    view = CausalLMView(tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=257,
                                                         n_positions=64)))
    idx = torch.randint(0, 257, (2, 32))
    return view, lambda mod: mod(idx, idx)[1]


FAMILIES = {"lm": (_lm, 4), "image": (_image, 2), "ocr": (_ocr, 8), "eo": (_eo, 4), "points": (_points, 6),
            "recall": (_recall, 2), "distill": (_distill, 2), "distill-hf": (_distill_hf, 2)}


def _run(model: nn.Module, loss_of, mode: str):
    m = copy.deepcopy(model).train()
    wrapped = apply_activation_checkpointing(m, mode)
    torch.manual_seed(1)
    loss = loss_of(m)
    loss.backward()
    grads = {k: p.grad for k, p in m.named_parameters() if p.grad is not None}
    return wrapped, loss.detach(), grads, {k: b.clone() for k, b in m.named_buffers()}, list(m.state_dict()), m


@pytest.mark.parametrize("mode", ["block", "selective"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradients_equal_those_without_checkpointing(family, mode):
    """Same loss, same gradient of every parameter, same running statistics, same state-dict keys; dropout and
    drop-path draw the same masks in the recomputation."""
    make, n_blocks = FAMILIES[family]
    torch.manual_seed(0)
    model, loss_of = make()
    _, loss0, grads0, buffers0, keys0, _ = _run(model, loss_of, "none")
    wrapped, loss, grads, buffers, keys, m = _run(model, loss_of, mode)
    assert wrapped == n_blocks and all(checkpointed_mode(b) == mode for b in blocks_of(m))
    assert torch.equal(loss, loss0) and keys == keys0 and sorted(grads) == sorted(grads0)
    for k in grads0:
        torch.testing.assert_close(grads[k], grads0[k], rtol=1e-5, atol=1e-7, msg=k)
    for k in buffers0:
        assert torch.equal(buffers[k], buffers0[k]), k


def test_running_statistics_advance_once_per_forward():
    """The OCR stem's batch norms: after one forward + backward with block checkpointing, the running statistics
    and counters equal those of the run without it (the recomputation updates spare copies)."""
    torch.manual_seed(0)
    model, loss_of = _ocr()
    *_, buffers0, _, _ = _run(model, loss_of, "none")
    *_, buffers, _, m = _run(model, loss_of, "block")
    tracked = [k for k in buffers0 if k.endswith("num_batches_tracked")]
    assert tracked and all(int(buffers[k]) == int(buffers0[k]) == 1 for k in tracked)
    assert all(torch.equal(buffers[k], buffers0[k]) for k in buffers0)


def test_names_and_evaluation_unchanged():
    """Wrapping swaps each block's class for a checkpointed subclass: the module tree, parameter names and state
    dict are those of the plain model (a plain model loads its state dict strictly), isinstance still holds, and
    under no_grad (evaluation) the block runs as before."""
    torch.manual_seed(0)
    plain = create_model("tiny-pom", n_layer=2, n_embd=32, n_head=2, block_size=32, sel_heads=2)
    m = copy.deepcopy(plain)
    apply_activation_checkpointing(m, "selective")
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert all(isinstance(b, PolyMorpher) and type(b) is not PolyMorpher for b in m.blocks)
    plain.load_state_dict(m.state_dict(), strict=True)
    idx = torch.randint(0, 256, (1, 32))
    with torch.no_grad():
        assert torch.equal(m.eval()(idx)[0], plain.eval()(idx)[0])
    apply_activation_checkpointing(m, "block")  # a wrapped block takes the new mode
    assert {checkpointed_mode(b) for b in m.blocks} == {"block"} and apply_activation_checkpointing(m, "none") == 0


def test_bad_mode_and_a_model_without_blocks_are_one_line():
    with pytest.raises(ValueError, match=r"^activation_checkpointing \(--activation-checkpointing\) must be none, "
                                         r"block or selective, got 'full'$"):
        TrainConfig(activation_checkpointing="full")
    with pytest.raises(ValueError, match=r"^dist_timeout \(--dist-timeout\) must be > 0, got 0$"):
        TrainConfig(dist_timeout=0)
    with pytest.raises(ValueError, match=r"^--activation-checkpointing block: Linear keeps no blocks in an "
                                         r"nn.ModuleList or nn.ModuleDict to checkpoint$"):
        apply_activation_checkpointing(nn.Linear(2, 2), "block")
    assert MODES == ("none", "block", "selective")


@pytest.mark.parametrize("argv, message", [
    (["--activation-checkpointing", "full"],
     "argument --activation-checkpointing: invalid choice: 'full' (choose from 'none', 'block', 'selective')"),
    (["--dist-timeout", "0"], "dist_timeout (--dist-timeout) must be > 0, got 0.0"),
])
def test_the_command_line_refuses_bad_values(argv, message, capsys, tmp_path):
    from polymixer.experiments.cli import main

    try:
        status = main(["train", "lm", *argv, "--out", str(tmp_path / "run"), "--quiet"])
    except SystemExit as stop:
        status = stop.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(message), err


def test_compiled_model_with_checkpointing_equals_eager():
    """torch.compile after the wrapping (as the loop does): the compiled checkpointed regions give the plain
    model's gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = create_model("tiny-pom", n_layer=2, n_embd=32, n_head=2, block_size=32, sel_heads=2)
    idx = torch.randint(0, 256, (2, 32))
    grads = {}
    for mode in ("none", "block", "selective"):
        m = copy.deepcopy(base)
        apply_activation_checkpointing(m, mode)
        torch.compile(m, backend="aot_eager")(idx, idx)[1].backward()
        grads[mode] = [p.grad for p in m.parameters()]
    torch._dynamo.reset()
    for mode in ("block", "selective"):
        for a, b in zip(grads[mode], grads["none"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


class _Stack(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(PolyMorpher(dim, "pom") for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x, causal=True)
        return x


def test_block_checkpointing_halves_peak_memory():
    """A 4-block causal PoM model at N = 16,384, d = 64: the peak of PyTorch's tensor allocations in one forward +
    backward (the profiler's allocations replayed) with block checkpointing ≤ 0.5× without (measured 0.33×;
    selective, which keeps the projections' outputs, 0.81×)."""
    from polymixer.experiments.bench.common import peak_memory_mb

    torch.manual_seed(0)
    base = _Stack(64, 4)
    x = torch.randn(1, 16384, 64, requires_grad=True)
    peaks = {}
    for mode in ("none", "block", "selective"):
        m = copy.deepcopy(base)
        apply_activation_checkpointing(m, mode)

        def step() -> None:
            m(x).square().mean().backward()

        step()  # (gradients allocated once, as in training)
        peaks[mode] = peak_memory_mb(step)
    ratio = peaks["block"] / peaks["none"]
    print(f"peak MB: {peaks}; block ÷ none = {ratio:.2f}")
    assert ratio <= 0.5, peaks
    assert peaks["selective"] < peaks["none"], peaks


# ---------------------------------------------------------------------------------------------------------------
# the training loop, one process and torchrun
# ---------------------------------------------------------------------------------------------------------------

SCRIPT = r"""
import json, sys
import torch
from polymixer.experiments.lm.task import train_lm
from polymixer.experiments.train.loop import TrainConfig

out, data, steps, stop, cp, fsdp, ac = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), \
    sys.argv[6] == "1", sys.argv[7]
cfg = TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup=1, eval_every=100, ckpt_every=100, log_every=1, out=out,
                  progress=False, seed=3, stop_after=None if stop == "-" else int(stop), context_parallel=cp,
                  fsdp=fsdp, activation_checkpointing=ac)
res = train_lm("tiny-hybrid", cfg, [data], pack=False, eval_windows=4, n_layer=2, n_embd=32, n_head=2,
               block_size=32, window=8, sel_heads=2, dropout=0.1)
sd = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu()
      for k, v in res["model"].state_dict().items()}
if res["rank"] == 0:
    torch.save(sd, f"{out}/weights.pt")
    json.dump([h["loss"] for h in res["history"] if "loss" in h], open(f"{out}/losses.json", "w"))
"""


def _train(tmp_path, corpus_dir, out, steps, procs=1, cp=1, fsdp=False, ac="none", stop=None):
    args = [out, corpus_dir, steps, "-" if stop is None else stop, cp, "1" if fsdp else "0", ac]
    torchrun(SCRIPT, args, tmp_path, procs, name="ac_train.py", timeout=300)
    return torch.load(out / "weights.pt"), json.loads((out / "losses.json").read_text())


def _assert_same(a, b, what):
    (wa, la), (wb, lb) = a, b
    assert la == lb, (what, la, lb)
    assert sorted(wa) == sorted(wb)
    for k in wb:
        assert torch.equal(wa[k], wb[k]), (what, k)


@pytest.mark.slow  # two training runs and a resume (~20 s)
@pytest.mark.usefixtures("polymixer_cache")
def test_a_checkpoint_of_a_checkpointed_run_resumes_without_it(tmp_path, corpus_dir):
    """One process, dropout on: a run with block checkpointing stopped after step 2 (its checkpoint), resumed
    without checkpointing to step 3, reaches the uninterrupted plain run's weights bit for bit — the checkpoint's
    keys and values do not depend on the setting."""
    plain = _train(tmp_path, corpus_dir, tmp_path / "plain", 3)
    _train(tmp_path, corpus_dir, tmp_path / "mixed", 3, ac="block", stop=2)
    _assert_same(_train(tmp_path, corpus_dir, tmp_path / "mixed", 3), plain, "resumed")


@pytest.mark.usefixtures("polymixer_cache")
def test_context_parallel_training_with_checkpointing_equals_without(tmp_path, corpus_dir):
    """Two ranks sharing each sequence (gloo), dropout on: block checkpointing recomputes the mixers' collectives
    in the backward, on both ranks alike — the losses and the weights after 2 steps equal those without it."""
    plain = _train(tmp_path, corpus_dir, tmp_path / "cp", 2, procs=2, cp=2)
    _assert_same(_train(tmp_path, corpus_dir, tmp_path / "cp_ac", 2, procs=2, cp=2, ac="block"), plain,
                 "context parallel")


@pytest.mark.slow  # two 2-rank FSDP runs: ~30 s on 2 cores
@pytest.mark.usefixtures("polymixer_cache")
def test_fsdp_training_with_checkpointing_equals_fsdp_alone(tmp_path, corpus_dir):
    """FSDP2 on 2 ranks after the wrapping (the recomputation runs on the parameters FSDP gathers for the
    backward): the losses and the weights after 2 steps equal FSDP's without checkpointing."""
    plain = _train(tmp_path, corpus_dir, tmp_path / "fsdp", 2, procs=2, fsdp=True)
    _assert_same(_train(tmp_path, corpus_dir, tmp_path / "fsdp_ac", 2, procs=2, fsdp=True, ac="selective"), plain,
                 "fsdp")


CP_MODELS = r"""
import copy
import torch
import torch.distributed as dist
from polymixer.models import create_model
from polymixer.ops.parallel import context_parallel
from polymixer.experiments.train.memory import apply_activation_checkpointing

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


def lm():
    m = create_model("tiny-hybrid", n_layer=2, n_embd=32, n_head=2, block_size=32, window=8, sel_heads=2)
    idx = torch.randint(0, m.config.vocab_size, (2, 32))
    a, b = rank * 32 // world, (rank + 1) * 32 // world
    return m, lambda mod: mod(idx[:, a:b], idx[:, a:b])[1]


def image():
    m = create_model("tiny-sit", input_size=8, hidden_size=32, depth=2, position="rope")
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x, t, y = torch.randn(2, m.config.in_channels, 8, 8), torch.rand(2), torch.randint(0, 10, (2,))
    return m, lambda mod: mod(x, t, y).square().mean()


def eo():  # the temporal encoder split over the ranks, the spatial one local (whole) inside the context
    m = create_model("tiny-tsvipom", dim=16, heads=2, temporal_depth=2, spatial_depth=2, sel_heads=2, image_size=8,
                     num_classes=5)
    x, doy = torch.randn(2, 4, 8, 8, 10), torch.randint(0, 366, (2, 4))
    return m, lambda mod: mod(x, doy).square().mean()


out = {}
for name, make in (("lm", lm), ("image", image), ("eo", eo)):
    torch.manual_seed(0)
    base, loss_of = make()
    runs = {}
    for mode in ("none", "block", "selective"):
        m = copy.deepcopy(base).train()
        apply_activation_checkpointing(m, mode)
        torch.manual_seed(1)
        with context_parallel() as cp:
            loss = loss_of(m)
            loss.backward()
        runs[mode] = (float(loss.detach()), {k: p.grad for k, p in m.named_parameters() if p.grad is not None},
                      cp.calls)
    loss0, grads0, calls0 = runs["none"]
    for mode in ("block", "selective"):
        loss, grads, calls = runs[mode]
        out[f"{name}/{mode}"] = {"loss": loss == loss0, "names": sorted(grads) == sorted(grads0),
                                 "exact": all(torch.equal(grads[k], grads0[k]) for k in grads0),
                                 "calls": [calls, calls0]}
report(out)
dist.destroy_process_group()
"""


def test_context_parallel_models_with_checkpointing_equal_without(tmp_path):
    """LM, image and satellite models under ``context_parallel`` on 2 ranks: with block and selective
    checkpointing every rank's loss and every parameter gradient equal those without it exactly; the
    recomputation ran more transfers (the mixers' exchanges again, in the backward) on every rank. The satellite
    model's spatial encoder runs whole (``local()``) inside the context: it is recomputed local too, although the
    backward runs inside the context."""
    torchrun(CP_MODELS, [], tmp_path, 2, name="cp_models.py", timeout=300)
    ranks = rank_results(tmp_path, 2)
    for key, r0 in ranks[0].items():
        r1 = ranks[1][key]
        for r in (r0, r1):
            assert r["loss"] and r["names"] and r["exact"], (key, r)
            assert r["calls"][0] > r["calls"][1], (key, r)
