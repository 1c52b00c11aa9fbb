"""``polymixer bench models``: the paper's models on a GPU, each against its attention baseline.

GPT-2 small (``gpt2-small``) against GPPoM2-S (``gppom2-small``), its hybrid (``gppom2-small-hybrid``) and a
value-PoM language model of the same size (``gppom2-small-value``); SiT-XL/2 against SiPoM-XL/2. Every block is
compiled (``torch.compile`` of each block, the regional compilation PyTorch recommends for repeated blocks: one
graph per kind of block and shape instead of one for the whole model; ``--dynamic``: one per kind of block),
weights and activations in bf16, attention on SDPA with FlashAttention first. Rotary positions, so that every
length runs (GPT-2's learned table stops at 1,024).

Parts, in the order they run (a time budget, ``--budget-s``, stops the later ones first):

1. ``lm_forward`` — forward tokens/s at the paper's token budget (128 × 1k, 32 × 4k, 8 × 16k, 4 × 32k tokens a
   call), the LM head over every token as in training, beside the paper's table and its GPPoM2 ÷ GPT-2 ratios;
2. ``image`` — images/s of SiT-XL/2 and SiPoM-XL/2 at 256 and 512 pixels (latents 32² and 64²), 262,144 patch tokens
   a call (batch 1,024 at 256 px, the paper's), beside the paper's 4,041 → 8,146 images/s;
3. ``lm_decode`` — the time of one more token after a context of 1k, 16k and 64k tokens (prefill, then single-token
   steps with the model's state: PoM's sums, local attention's ring buffer, global attention's KV cache; batch 1;
   the steps run eager, each a few dozen small kernels);
4. ``lm_train`` — a training step (forward, backward, AdamW) at 32,768 tokens a step by default (the forward's 131k
   would need more than an H100's 80 GB for GPT-2's logits and activations alone), its time and peak memory.

Models of one part are timed interleaved (round-robin), so ratios come from one run. A configuration that runs out
of memory, or fails, is recorded with its reason and the others go on. ``--dry-run`` runs the same code on the CPU
with tiny versions of the same presets (2 layers, eager, fp32, a few tokens): it tests the path, and its numbers are
never GPU figures.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ...models import count_parameters, create_model
from ..report import format_table, new_figure, save_figure
from .common import (failure, gpu_facts, peak_memory_mb, print_written, recompile_limit, record_part,
                     release_memory, report_again, run_parts, synchronized, time_interleaved, write_report)
from ...ranges import Range
from ..tasks.common import float_in, int_at_least

__all__ = ["ModelsBenchConfig", "PAPER_LM", "PAPER_IMAGES", "run", "banner", "sections", "report", "plot",
           "add_arguments", "main"]

LM_PRESETS = ("gpt2-small", "gppom2-small", "gppom2-small-hybrid", "gppom2-small-value")
IMAGE_PRESETS = ("sit-xl/2", "sipom-xl/2")
PARTS = ("lm_forward", "image", "lm_decode", "lm_train")
NAMES = {"gpt2-small": "GPT-2-S", "gppom2-small": "GPPoM2-S", "gppom2-small-hybrid": "GPPoM2-S hybrid",
         "gppom2-small-value": "value-PoM LM", "sit-xl/2": "SiT-XL/2", "sipom-xl/2": "SiPoM-XL/2"}
# the paper's GPT-2 table (H100, forward k tokens/s by tokens per sequence) and its images/s (batch 1,024, 256 px)
PAPER_LM: Dict[str, Dict[int, float]] = {
    "gpt2-small": {1024: 572.3, 4096: 294.6, 16384: 99.3, 32768: 52.4},
    "gppom2-small": {1024: 995.7, 4096: 893.1, 16384: 624.2, 32768: 447.5},
    "gppom2-small-hybrid": {1024: 796, 4096: 533, 16384: 228, 32768: 129},
}
PAPER_IMAGES: Dict[str, Dict[int, float]] = {"sit-xl/2": {256: 4041}, "sipom-xl/2": {256: 8146}}
VAE_FACTOR = 8  # pixels per latent cell (the SD VAE of DiT / SiT)


@dataclass
class ModelsBenchConfig:
    lm_presets: Tuple[str, ...] = LM_PRESETS  # the first is the baseline of the ratios
    lm_shapes: Tuple[Tuple[int, int], ...] = ((128, 1024), (32, 4096), (8, 16384), (4, 32768))  # (batch, tokens)
    train_tokens: int = 32768  # tokens of a training step: batch = train_tokens / N
    decode_contexts: Tuple[int, ...] = (1024, 16384, 65536)
    decode_steps: int = 16
    image_presets: Tuple[str, ...] = IMAGE_PRESETS  # the first is the baseline of the ratios
    image_latents: Tuple[int, ...] = (32, 64)  # latent sides: 256 and 512 pixels
    image_tokens: int = 262144  # patch tokens a call: batch 1,024 at 256 px
    warmup: int = 1
    repeats: int = 3
    parts: Tuple[str, ...] = PARTS
    device: str = "cuda"
    dtype: str = "bf16"  # "bf16" or "fp32"
    compile: bool = True
    dynamic: bool = False  # compile once per kind of block with symbolic shapes (fewer compiles; untested on a GPU)
    budget_s: Optional[float] = None  # no configuration starts after this many seconds (the rest: "not run")
    dry_run: bool = False
    lm_overrides: Dict[str, Any] = field(default_factory=dict)  # config fields of every LM preset (the dry run's)
    image_overrides: Dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    out: str = "runs/bench/models"
    extra: Dict[str, Any] = field(default_factory=dict)


# the CPU dry run: the same presets at 2 layers × 64 channels, a few tokens, eager, fp32
DRY_RUN = dict(lm_shapes=((4, 32), (2, 64)), train_tokens=64, decode_contexts=(16, 48), decode_steps=3,
               image_latents=(8, 16), image_tokens=64, repeats=2, device="cpu", dtype="fp32", compile=False,
               dry_run=True, lm_overrides={"n_layer": 2, "n_embd": 64, "n_head": 2, "sel_heads": 2, "value_heads": 2,
                             "vocab_size": 257, "window": 8},
               image_overrides={"depth": 2, "hidden_size": 64, "num_heads": 2, "num_classes": 10})


class Budget:
    """The wall-clock budget of a run: configurations that would start after it are recorded as not run."""

    def __init__(self, seconds: Optional[float]) -> None:
        self.end = None if seconds is None else time.monotonic() + seconds

    def spent(self) -> bool:
        return self.end is not None and time.monotonic() > self.end


NOT_RUN = "not run: the time budget (--budget-s) was spent"


def _dtype(cfg: ModelsBenchConfig) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg.dtype]


@contextlib.contextmanager
def flash_first(device: torch.device) -> Iterator[None]:
    """SDPA with FlashAttention first on CUDA (then the memory-efficient kernel for calls with a mask — local
    attention's blocks, decoding — and the math fallback); nothing changes elsewhere."""
    if device.type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    try:
        ctx = sdpa_kernel(order, set_priority=True)
    except TypeError:  # torch without priorities: the default order, which puts flash first
        ctx = sdpa_kernel(order)
    with ctx:
        yield


def _compiled(model: torch.nn.Module, cfg: ModelsBenchConfig) -> torch.nn.Module:
    """Every block under ``torch.compile`` (regional compilation: blocks of one kind share one graph), one static
    graph per shape — the form the layer bench measured on a GPU — or (``dynamic``) one graph for every shape."""
    if cfg.compile:
        for blk in model.blocks:
            blk.compile(dynamic=cfg.dynamic)
    return model


def _lm(cfg: ModelsBenchConfig, preset: str, longest: int) -> torch.nn.Module:
    m = create_model(preset, position="rope", block_size=longest, **cfg.lm_overrides)
    return _compiled(m.to(torch.device(cfg.device), _dtype(cfg)).eval(), cfg)


def _image_model(cfg: ModelsBenchConfig, preset: str, latent: int) -> torch.nn.Module:
    m = create_model(preset, input_size=latent, **cfg.image_overrides)
    return _compiled(m.to(torch.device(cfg.device), _dtype(cfg)).eval(), cfg)


def _fail_reason(e: Exception) -> str:
    """An out-of-memory configuration reads "out of memory"; any other failure its type and first line."""
    return failure(e) or f"error: {type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e) else ''}"


def _timed(fns: Dict[str, Callable[[], Any]], cfg: ModelsBenchConfig, dev: torch.device, budget: Budget,
           failed: Dict[str, str]) -> Dict[str, float]:
    """Median seconds of each callable, interleaved: each one first runs alone (compiling, warming up); one that
    fails or runs out of memory is dropped with its reason in ``failed``, one left after the budget is spent too."""
    ready = {}
    for name, fn in fns.items():
        if budget.spent():
            failed[name] = NOT_RUN
            continue
        fn = synchronized(fn, dev)
        try:
            for _ in range(cfg.warmup + (1 if cfg.compile else 0)):
                fn()
            ready[name] = fn
        except Exception as e:  # noqa: BLE001 - a configuration's failure is recorded, the others go on
            failed[name] = _fail_reason(e)
            release_memory(dev)
    if not ready:
        return {}
    try:
        return {k: t.median for k, t in time_interleaved(ready, warmup=0, repeats=cfg.repeats).items()}
    except Exception as e:  # noqa: BLE001 - e.g. memory fragmented by the others: each is then timed alone
        release_memory(dev)
        out = {}
        for name, fn in ready.items():
            try:
                out[name] = time_interleaved({name: fn}, warmup=0, repeats=cfg.repeats)[name].median
            except Exception as e2:  # noqa: BLE001
                failed[name] = _fail_reason(e2)
                release_memory(dev)
        if not out:
            failed.setdefault("(interleaved)", _fail_reason(e))
        return out


def _record(cfg: ModelsBenchConfig, part: str, result: Dict[str, Any]) -> None:
    """Write a part as it stands (after each shape), so a run stopped from outside keeps what it measured."""
    record_part(Path(cfg.out) / "models.json", part, cfg, lambda old: result)


def _failure_rows(failed: Dict[str, str], **where: Any) -> List[Dict[str, Any]]:
    return [{"model": name, **where, "reason": why} for name, why in failed.items()]


def run_lm_forward(cfg: ModelsBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Forward tokens/s of every LM at each (batch, length) of the paper's table, interleaved; ratios to the first
    preset beside the paper's."""
    from tqdm.auto import tqdm

    dev, budget = torch.device(cfg.device), Budget(cfg.budget_s)
    torch.manual_seed(cfg.seed)
    torch._dynamo.reset()
    longest = max(n for _, n in cfg.lm_shapes)
    models = {p: _lm(cfg, p, longest) for p in cfg.lm_presets}
    vocab = next(iter(models.values())).config.vocab_size
    result: Dict[str, Any] = {"rows": [], "failed": [], "params": {p: count_parameters(m) for p, m in models.items()},
                              "gpu": gpu_facts(dev) if dev.type == "cuda" else None}
    base = cfg.lm_presets[0]
    for b, n in tqdm(cfg.lm_shapes, desc="bench models: lm forward", disable=not progress):
        idx = torch.randint(0, vocab, (b, n), device=dev)
        failed: Dict[str, str] = {}
        with torch.no_grad(), flash_first(dev), recompile_limit():
            t = _timed({p: (lambda m=m: m(idx)) for p, m in models.items()}, cfg, dev, budget, failed)
        for p in cfg.lm_presets:
            if p in t:
                paper = PAPER_LM.get(p, {}).get(n)
                result["rows"].append({"model": p, "N": n, "batch": b, "ms": 1e3 * t[p],
                                       "ktok_s": b * n / t[p] / 1e3, "paper_ktok_s": paper})
        _ratios(result["rows"], n, base, "N", "ktok_s", PAPER_LM)
        result["failed"] += _failure_rows(failed, N=n, batch=b)
        release_memory(dev)
        _record(cfg, "lm_forward", result)
    return result


def _ratios(rows: List[Dict[str, Any]], at: int, base: str, key: str, metric: str,
            paper: Dict[str, Dict[int, float]]) -> None:
    """Each row's ``metric`` ÷ the baseline's at the same ``key`` value, and the paper's ratio where it has both."""
    mine = [r for r in rows if r[key] == at]
    ref = next((r for r in mine if r["model"] == base), None)
    for r in mine:
        r["vs_base"] = None if ref is None else r[metric] / ref[metric]
        a, p = paper.get(base, {}).get(at), paper.get(r["model"], {}).get(at)
        r["paper_vs_base"] = None if a is None or p is None else p / a


def run_image(cfg: ModelsBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Images/s of each image model at every latent side, interleaved; ratios to the first preset."""
    from tqdm.auto import tqdm

    dev, dtype, budget = torch.device(cfg.device), _dtype(cfg), Budget(cfg.budget_s)
    torch.manual_seed(cfg.seed)
    result: Dict[str, Any] = {"rows": [], "failed": [], "params": {},
                              "gpu": gpu_facts(dev) if dev.type == "cuda" else None}
    for latent in tqdm(cfg.image_latents, desc="bench models: images", disable=not progress):
        torch._dynamo.reset()
        models = {p: _image_model(cfg, p, latent) for p in cfg.image_presets}
        result["params"] = {p: count_parameters(m) for p, m in models.items()}
        c = next(iter(models.values())).config
        tokens = (latent // c.patch_size) ** 2
        b = max(1, cfg.image_tokens // tokens)
        x = torch.randn(b, c.in_channels, latent, latent, device=dev, dtype=dtype)
        t = torch.rand(b, device=dev)
        y = torch.randint(0, c.num_classes, (b,), device=dev)
        failed: Dict[str, str] = {}
        with torch.no_grad(), flash_first(dev), recompile_limit():
            sec = _timed({p: (lambda m=m: m(x, t, y)) for p, m in models.items()}, cfg, dev, budget, failed)
        px = latent * VAE_FACTOR
        for p in cfg.image_presets:
            if p in sec:
                result["rows"].append({"model": p, "px": px, "latent": latent, "tokens": tokens, "batch": b,
                                       "ms": 1e3 * sec[p], "images_s": b / sec[p],
                                       "paper_images_s": PAPER_IMAGES.get(p, {}).get(px)})
        _ratios(result["rows"], px, cfg.image_presets[0], "px", "images_s", PAPER_IMAGES)
        result["failed"] += _failure_rows(failed, px=px, batch=b)
        models = {}  # the next side's models replace them
        release_memory(dev)
        _record(cfg, "image", result)
    return result


@torch.no_grad()
def run_lm_decode(cfg: ModelsBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Milliseconds of one more token after each context (batch 1): the prompt prefilled in one step, then
    single-token steps with the model's state; the median of ``decode_steps`` steps after two warm-up steps."""
    from tqdm.auto import tqdm

    dev, budget = torch.device(cfg.device), Budget(cfg.budget_s)
    torch.manual_seed(cfg.seed)
    longest = max(cfg.decode_contexts) + cfg.decode_steps + 8
    result: Dict[str, Any] = {"rows": [], "failed": [], "gpu": gpu_facts(dev) if dev.type == "cuda" else None}
    plan = [(p, n) for n in cfg.decode_contexts for p in cfg.lm_presets]
    models: Dict[str, torch.nn.Module] = {}
    for p, n in tqdm(plan, desc="bench models: lm decode", disable=not progress):
        if budget.spent():
            result["failed"].append({"model": p, "context": n, "reason": NOT_RUN})
            continue
        if p not in models:
            models[p] = create_model(p, position="rope", block_size=longest, **cfg.lm_overrides).to(
                dev, _dtype(cfg)).eval()
        model = models[p]
        try:
            with flash_first(dev):
                result["rows"].append(_decode_row(cfg, model, p, n, dev))
        except Exception as e:  # noqa: BLE001 - recorded, the others go on
            result["failed"].append({"model": p, "context": n, "reason": _fail_reason(e)})
        release_memory(dev)
        _record(cfg, "lm_decode", result)
    for p in cfg.lm_presets:
        mine = [r for r in result["rows"] if r["model"] == p]
        for r in mine:
            r["vs_first_context"] = r["ms_per_token"] / mine[0]["ms_per_token"]
    return result


def _decode_row(cfg: ModelsBenchConfig, model: torch.nn.Module, preset: str, n: int,
                dev: torch.device) -> Dict[str, Any]:
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, n), device=dev)
    t0 = time.perf_counter()
    state = model.step(prompt, model.init_state(1, device=dev))[1]
    synchronized(lambda: None, dev)()
    prefill = time.perf_counter() - t0
    tok = torch.randint(0, vocab, (1, 1), device=dev)
    holder = [state]

    def step() -> None:
        holder[0] = model.step(tok, holder[0])[1]

    t = time_interleaved({"step": synchronized(step, dev)}, warmup=2, repeats=cfg.decode_steps)["step"]
    return {"model": preset, "context": n, "ms_per_token": 1e3 * t.median, "spread": t.spread,
            "state_mb": holder[0].memory_bytes / 2**20, "prefill_s": prefill}


def run_lm_train(cfg: ModelsBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """A training step (forward with the loss, backward, AdamW) of every LM at ``train_tokens`` tokens per step and
    each length of the forward part, interleaved; its time, tokens/s and peak memory."""
    from tqdm.auto import tqdm

    dev, budget = torch.device(cfg.device), Budget(cfg.budget_s)
    torch.manual_seed(cfg.seed)
    torch._dynamo.reset()
    longest = max(n for _, n in cfg.lm_shapes)
    models = {p: _lm(cfg, p, longest).train() for p in cfg.lm_presets}
    opts = {p: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=dev.type == "cuda") for p, m in models.items()}
    vocab = next(iter(models.values())).config.vocab_size
    result: Dict[str, Any] = {"rows": [], "failed": [], "gpu": gpu_facts(dev) if dev.type == "cuda" else None}
    for _, n in tqdm(cfg.lm_shapes, desc="bench models: lm train", disable=not progress):
        b = max(1, cfg.train_tokens // n)
        idx = torch.randint(0, vocab, (b, n + 1), device=dev)
        x, y = idx[:, :-1], idx[:, 1:]
        steps = {p: _train_step(models[p], opts[p], x, y) for p in models}
        failed: Dict[str, str] = {}
        with flash_first(dev), recompile_limit():
            t = _timed(steps, cfg, dev, budget, failed)
            peaks = {}
            for p in t:
                try:
                    peaks[p] = peak_memory_mb(steps[p], dev)
                except Exception as e:  # noqa: BLE001
                    failed[p] = _fail_reason(e)
        for p in cfg.lm_presets:
            if p in t:
                result["rows"].append({"model": p, "N": n, "batch": b, "ms": 1e3 * t[p],
                                       "ktok_s": b * n / t[p] / 1e3, "peak_mb": peaks.get(p)})
        _ratios(result["rows"], n, cfg.lm_presets[0], "N", "ktok_s", {})
        result["failed"] += _failure_rows(failed, N=n, batch=b)
        steps = {}
        release_memory(dev)
        _record(cfg, "lm_train", result)
    return result


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                y: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


PART_FNS: Dict[str, Callable[[ModelsBenchConfig, bool], Dict[str, Any]]] = {
    "lm_forward": run_lm_forward, "image": run_image, "lm_decode": run_lm_decode, "lm_train": run_lm_train}


def run(cfg: ModelsBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Run the parts ``cfg.parts`` names (the budget, if any, shared by all of them, in order); write models.json,
    models.txt and models.png under ``cfg.out``."""
    dev = torch.device(cfg.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but PyTorch sees no CUDA device here (on a CPU: --dry-run)")
    if dev.type != "cuda" and not cfg.dry_run:
        raise ValueError("the model bench times paper-size models on a GPU; on a CPU run its --dry-run")
    unknown = set(cfg.parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    end = None if cfg.budget_s is None else time.monotonic() + cfg.budget_s

    def within_budget(fn: Callable[[ModelsBenchConfig, bool], Dict[str, Any]]
                      ) -> Callable[[ModelsBenchConfig, bool], Dict[str, Any]]:
        def part(c: ModelsBenchConfig, p: bool) -> Dict[str, Any]:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:  # not even its models built
                return {"rows": [], "failed": [{"model": "every model", "reason": NOT_RUN}]}
            return fn(c if left is None else _with_budget(c, left), p)
        return part

    out = Path(cfg.out)
    payload = run_parts(cfg, out / "models.json", {k: within_budget(PART_FNS[k]) for k in PARTS}, progress)
    write_report(out, "models", payload, plot, report)
    return payload


def _with_budget(cfg: ModelsBenchConfig, left: float) -> ModelsBenchConfig:
    return replace(cfg, budget_s=max(0.0, left))


# ---------------------------------------------------------------------------------------------------------------
# report and plot
# ---------------------------------------------------------------------------------------------------------------

def _name(preset: str) -> str:
    return NAMES.get(preset, preset)


def _rows_named(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{**r, "name": _name(r["model"])} for r in rows]


def banner(payload: Dict[str, Any]) -> List[str]:
    """The report's first lines: the card, versions and settings it was measured with — or that it is a dry run,
    whose numbers are no GPU figures."""
    cfg = payload.get("config", {})
    gpu = next((payload[p].get("gpu") for p in PARTS if p in payload and payload[p].get("gpu")), None)
    if cfg.get("dry_run"):
        return ["DRY RUN on the CPU (tiny versions of the presets, eager, fp32, a few tokens): it tests the code "
                "path; none of these numbers is a GPU figure, and no ratio below is compared with the paper's", ""]
    where = f"{gpu['name']} ({gpu['arch']}), CUDA {gpu['cuda']}, Triton {gpu['triton']}, driver {gpu['driver']}" \
        if gpu else payload.get("machine", {}).get("cpu", "?")
    return [f"measured on {where}; torch {payload.get('machine', {}).get('torch')}; {cfg.get('dtype')}, "
            f"{'every block compiled' if cfg.get('compile') else 'eager'}, SDPA with FlashAttention first", ""]


def _verdict(payload: Dict[str, Any], rows: Sequence[Dict[str, Any]]) -> str:
    """Whether each measured ratio reaches the paper's: met / MISSED, "not measured (no GPU)" on a dry run."""
    pairs = [r for r in rows if r.get("paper_vs_base") is not None and r.get("vs_base") is not None
             and r["paper_vs_base"] != 1.0]
    if not pairs:
        return ""
    if payload.get("config", {}).get("dry_run"):
        return "ratio at least the paper's: not measured (no GPU: a dry run)"
    ok = all(r["vs_base"] >= r["paper_vs_base"] for r in pairs)
    return ("ratio at least the paper's at every point: " + ("met" if ok else "MISSED") + " (" +
            ", ".join(f"{_name(r['model'])} @ {r.get('N', r.get('px'))}: {r['vs_base']:.2f}× vs "
                      f"{r['paper_vs_base']:.2f}×" for r in pairs) + ")")


def _failed_lines(part: Dict[str, Any]) -> List[str]:
    out = []
    for f in part.get("failed", []):
        where = ", ".join(f"{k} {v}" for k, v in f.items() if k not in ("model", "reason"))
        out.append(f"  {_name(f['model'])} ({where}): {f['reason']}")
    return (["not measured:"] + out) if out else []


def sections(payload: Dict[str, Any]) -> List[Tuple[str, str, List[str]]]:
    """(title, table, notes) of every part present: the tables, the ratios beside the paper's and every
    configuration not measured with its reason — the text report's and docs/gpu.md's (``polymixer bench gpu``)."""
    out = []
    if "lm_forward" in payload:
        p = payload["lm_forward"]
        out.append(("language models, forward (k tokens/s; the LM head over every token), ratios to GPT-2-S beside "
                     "the paper's (H100)",
                     format_table(_rows_named(p["rows"]), ["N", "batch", "name", "ms", "ktok_s", "paper_ktok_s",
                                                           "vs_base", "paper_vs_base"],
                                  ["N", "B", "model", "ms", "k tok/s", "paper k tok/s", "÷ GPT-2-S",
                                   "paper ÷ GPT-2"]),
                     ["params: " + ", ".join(f"{_name(k)} {v:,}" for k, v in p.get("params", {}).items())]
                     + [v for v in [_verdict(payload, p["rows"])] if v] + _failed_lines(p)))
    if "image" in payload:
        p = payload["image"]
        out.append(("diffusion transformers, forward images/s, ratios to SiT-XL/2 beside the paper's (batch 1,024, "
                    "256 px)",
                    format_table(_rows_named(p["rows"]), ["px", "latent", "tokens", "batch", "name", "ms",
                                                          "images_s", "paper_images_s", "vs_base", "paper_vs_base"],
                                 ["px", "latent", "tokens", "B", "model", "ms", "images/s", "paper images/s",
                                  "÷ SiT", "paper ÷ SiT"]),
                    ["params: " + ", ".join(f"{_name(k)} {v:,}" for k, v in p.get("params", {}).items())]
                    + [v for v in [_verdict(payload, p["rows"])] if v] + _failed_lines(p)))
    if "lm_decode" in payload:
        p = payload["lm_decode"]
        out.append(("decoding: one more token after a context of N tokens (batch 1, eager steps)",
                    format_table(_rows_named(p["rows"]), ["context", "name", "ms_per_token", "vs_first_context",
                                                          "state_mb", "prefill_s"],
                                 ["context", "model", "ms / token", "÷ first context", "state MB", "prefill s"]),
                    _failed_lines(p)))
    if "lm_train" in payload:
        p = payload["lm_train"]
        out.append((f"training step (forward, backward, AdamW), {payload['config'].get('train_tokens'):,} tokens a "
                    "step; peak memory above the weights and optimizer state",
                    format_table(_rows_named(p["rows"]), ["N", "batch", "name", "ms", "ktok_s", "vs_base",
                                                          "peak_mb"],
                                 ["N", "B", "model", "ms / step", "k tok/s", "÷ GPT-2-S", "peak MB"]),
                    _failed_lines(p)))
    return out


def report(payload: Dict[str, Any], seeds: Optional[List[Dict[str, Any]]] = None,
           main_json: Optional[Dict[str, Any]] = None) -> str:
    """The text report: the banner (where it was measured, or that it is a dry run) and every part's section
    (``seeds`` / ``main_json``: the skeleton's signature; this bench has no seeds)."""
    lines = banner(payload)
    for title, table, notes in sections(payload):
        lines += [title, table] + notes + [""]
    return "\n".join(lines)


def plot(payload: Dict[str, Any], path: Path) -> None:
    """Forward tokens/s and its ratio to GPT-2 (with the paper's, dashed), training step time, decoding time per
    token, and images/s beside the paper's."""
    parts = [p for p in PARTS if p in payload and payload[p].get("rows")]
    if not parts:
        return
    panels = []
    if "lm_forward" in parts:
        panels += [("lm_forward", "ktok_s"), ("lm_forward", "vs_base")]
    panels += [(p, None) for p in ("lm_train", "lm_decode", "image") if p in parts]
    fig, axes = new_figure(len(panels), width=4.6)
    for ax, (part, key) in zip(axes, panels):
        rows = payload[part]["rows"]
        if part == "image":
            _plot_images(ax, rows)
            continue
        x, y, paper, title, ylabel = {
            ("lm_forward", "ktok_s"): ("N", "ktok_s", "paper_ktok_s", "LM forward", "k tokens/s"),
            ("lm_forward", "vs_base"): ("N", "vs_base", "paper_vs_base", "LM forward ÷ GPT-2-S", "ratio"),
            ("lm_train", None): ("N", "ms", None, "training step", "ms per step"),
            ("lm_decode", None): ("context", "ms_per_token", None, "decoding", "ms per token"),
        }[(part, key)]
        for k, model in enumerate(dict.fromkeys(r["model"] for r in rows)):
            mine = [r for r in rows if r["model"] == model]
            ax.plot([r[x] for r in mine], [r[y] for r in mine], marker="o", color=f"C{k}", label=_name(model))
            ref = [r for r in mine if paper and r.get(paper) is not None]
            if ref:
                ax.plot([r[x] for r in ref], [r[paper] for r in ref], ls="--", marker="x", color=f"C{k}",
                        label=f"{_name(model)} (paper)")
        ax.set_xscale("log", base=2)
        if key != "vs_base":
            ax.set_yscale("log")
        ax.set_xlabel("tokens per sequence" if x == "N" else "context tokens")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(" ".join(banner(payload)).strip()[:160], fontsize=8)
    save_figure(fig, path)


def _plot_images(ax: Any, rows: Sequence[Dict[str, Any]]) -> None:
    """Images/s per model and resolution as bars, the paper's as hollow bars beside."""
    pxs = sorted({r["px"] for r in rows})
    models = list(dict.fromkeys(r["model"] for r in rows))
    width = 0.8 / max(1, 2 * len(models))
    for k, model in enumerate(models):
        for j, px in enumerate(pxs):
            r = next((r for r in rows if r["model"] == model and r["px"] == px), None)
            if r is None:
                continue
            ax.bar(j + (2 * k) * width, r["images_s"], width, color=f"C{k}",
                   label=_name(model) if j == 0 else None)
            if r.get("paper_images_s"):
                ax.bar(j + (2 * k + 1) * width, r["paper_images_s"], width, fill=False, edgecolor=f"C{k}",
                       hatch="//", label=f"{_name(model)} (paper)")
    ax.set_xticks([j + width * (len(models) - 0.5) for j in range(len(pxs))], [f"{px} px" for px in pxs])
    ax.set_ylabel("images / s")
    ax.set_title("diffusion transformers")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=6)


# ---------------------------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ModelsBenchConfig()
    p.add_argument("--dry-run", action="store_true",
                   help="the whole bench on the CPU at tiny sizes (2-layer versions of the presets, eager, fp32): "
                        "tests the code path, measures nothing a GPU figure can be taken from")
    p.add_argument("--device", default=d.device, help="cuda (the bench's purpose); cpu only with --dry-run")
    p.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(d.parts))
    p.add_argument("--lm-presets", nargs="+", default=None, help="language models (the first: the ratios' baseline)")
    p.add_argument("--image-presets", nargs="+", default=None, help="image models (the first: the baseline)")
    p.add_argument("--lm-shapes", nargs="+", default=None, metavar="BxN",
                   help="forward shapes, batch × tokens, e.g. 128x1024 32x4096 (default: the paper's table)")
    p.add_argument("--train-tokens", type=int_at_least(1), default=None, help="tokens of a training step")
    p.add_argument("--contexts", type=int_at_least(1), nargs="+", default=None, help="decoding contexts")
    p.add_argument("--latents", type=int_at_least(1), nargs="+", default=None, help="latent sides of the image models")
    p.add_argument("--repeats", type=int_at_least(1), default=None)
    p.add_argument("--no-compile", action="store_true", help="eager models (the bench's figures are compiled)")
    p.add_argument("--dynamic", action="store_true",
                   help="compile each kind of block once with symbolic shapes instead of once per shape")
    p.add_argument("--budget-s", type=float_in(Range(0, low_open=True)), default=None,
                   help="no configuration starts after this many seconds; the rest are listed as not run (a "
                        "device session's fixed time)")
    p.add_argument("--report", action="store_true", help="time nothing: write models.txt and models.png again")
    p.add_argument("--out", default=d.out)


def _shapes(specs: Sequence[str]) -> Tuple[Tuple[int, int], ...]:
    try:
        shapes = tuple((int(b), int(n)) for b, n in (s.lower().split("x") for s in specs))
    except ValueError:
        raise ValueError(f"--lm-shapes takes batch x tokens, e.g. 128x1024, got {' '.join(specs)}") from None
    if any(b < 1 or n < 1 for b, n in shapes):
        raise ValueError("--lm-shapes: batch and tokens must be positive")
    return shapes


def main(args: argparse.Namespace) -> int:
    """Run the parts asked for (``--dry-run``: on the CPU at tiny sizes), or ``--report`` the earlier run again."""
    out = Path(args.out)
    if args.report:
        print(report_again(out, "models", plot, report))
        return 0
    cfg = ModelsBenchConfig(parts=tuple(args.parts), out=args.out, budget_s=args.budget_s)
    if args.dry_run:
        for k, v in DRY_RUN.items():
            setattr(cfg, k, v)
    else:
        cfg.device = args.device
    for arg, name in (("lm_presets", "lm_presets"), ("image_presets", "image_presets"),
                      ("train_tokens", "train_tokens"), ("contexts", "decode_contexts"), ("latents", "image_latents"),
                      ("repeats", "repeats")):
        v = getattr(args, arg)
        if v is not None:
            setattr(cfg, name, tuple(v) if isinstance(v, list) else v)
    if args.lm_shapes:
        cfg.lm_shapes = _shapes(args.lm_shapes)
    if args.no_compile:
        cfg.compile = False
    cfg.dynamic = args.dynamic
    started = time.time()
    run(cfg)
    print_written(out, "models", since=started)
    return 0

