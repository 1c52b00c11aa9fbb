"""``polymixer bench mixer``: PoM against attention, sweeping sequence length at a fixed token budget.

Every configuration mixes the same number of tokens (batch = budget / N), so a linear-time mixer draws a flat line
and attention a rising one — the paper's Figure 1a, measured on this machine. Timings are interleaved round-robin
with warm-up and the median of several repeats; ratios are taken within one run.

Each PoM is also timed against its own floor, its matrix products alone: for PoM the two projections, for the
value-carrying PoM the projections and the state products of :func:`polymixer.values.value_mix` on the raw
projections (no polynomial, shift, norm or gate), chunked for causal mixing, two products for full mixing. Two
value PoMs run: ``value_pom`` (D = expand·d, ``value_dim`` × ``value_heads``, a gate per channel) and
``value_pom_att``, sized as attention (D = dv = d over attention's heads, one gate scalar per head), whose
projections cost what attention's four d × d ones do (:func:`attention_sized_value_pom`). Every mixer runs full and
causal, forward and forward + backward, eager and (``compile``) under ``torch.compile``; on a GPU PoM's torch form
and its Triton routes side by side. ``--mixers`` runs a subset and keeps the rows of the others from the earlier
``mixer.json``, which is written again after every length (a run stopped early keeps the lengths it finished).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import os
import statistics
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from ...layers.attention import Attention
from ...layers.pom import PoM
from ...layers.value_pom import ValuePoM
from ...models import count_parameters
from ..report import figure_title, format_table, new_figure, save_figure
from ...values import value_mix
from ...ops import backend
from ...ranges import Range
from ..tasks.common import float_in, int_at_least
from .common import (MachineLoad, apply_overrides, failure, gpu_facts, machine, peak_memory_mb, recompile_limit,
                     release_memory, synchronized, time_interleaved, read_json, write_json)

__all__ = ["MixerBenchConfig", "run", "predicted_crossover", "attention_sized_value_pom", "header", "report", "plot",
           "write_report", "run_dtype", "add_arguments", "main"]

MIXERS = ("pom", "value_pom", "value_pom_att", "attention")
# the row names of the two value PoMs (the rows of a mixer start with its name)
VALUE_ROWS = {"value_pom": "value pom", "value_pom_att": "value pom att-sized"}


@dataclass
class MixerBenchConfig:
    dim: int = 512
    expand: int = 2
    degree: int = 2
    heads: int = 8
    tokens: int = 16384
    lengths: Tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384)
    pom_lengths: Tuple[int, ...] = (32768, 65536)  # PoM only: attention is out of reach here
    warmup: int = 1
    repeats: int = 5
    compile: bool = True
    backward: bool = True
    naive_max_gb: float = 2.5  # skip naive attention when its N×N score tensors would exceed this
    naive: bool = True  # time naive attention (the textbook N×N baseline) too
    value_dim: int = 512  # the value-carrying PoM: dv, split over value_heads (state D·dv/H per head... and layer)
    value_heads: int = 8
    mixers: Tuple[str, ...] = MIXERS  # value_pom_att: the value PoM at attention's size (attention_sized_value_pom)
    compile_lengths: Optional[Tuple[int, ...]] = None  # the lengths with compiled columns (None: every length)
    # packed causal sequences of the value PoM (fwd + bwd): mixed in place against the same sequences as a padded batch
    packed_layouts: Tuple[Tuple[int, ...], ...] = ((128,) * 16, (1024,) + (16,) * 64)
    device: str = "cpu"  # "cuda": every mixer on the GPU, with the Triton kernels' columns beside eager and compiled
    dtype: str = "auto"  # "auto": fp32 on the CPU, bf16 on a GPU (SDPA then takes FlashAttention); "fp32", "bf16"
    seed: int = 0
    out: str = "runs/bench/mixer"
    extra: Dict[str, Any] = field(default_factory=dict)


# README command 1: the README's own rows (N 1k and 4k at its 16k-token budget, forward), PoM against its floor and
# SDPA, eager, 7 interleaved repeats (13 when the machine is busy): ~1–2 min and < 1 GB alone
QUICK = dict(lengths=(1024, 4096), pom_lengths=(), tokens=16384, repeats=7, warmup=1, compile=False, backward=False,
             mixers=("pom", "attention"), packed_layouts=(), naive=False)


def predicted_crossover(d: int, D: int, k: int) -> float:
    """The paper's cost model: PoM 3ndD + (k+1)nD vs attention 4nd² + 2dn² multiplications; PoM is cheaper when
    n ≥ (D(3d + k + 1) − 4d²) / (2d)  (= d + 3 for D = 2d, k = 2)."""
    return (D * (3 * d + k + 1) - 4 * d * d) / (2 * d)


class _NaiveAttention(torch.nn.Module):
    """softmax(q kᵀ/√d) v with the N×N score matrix written out: the textbook baseline."""

    def __init__(self, att: Attention) -> None:
        super().__init__()
        self.att = att

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        a = self.att
        q, k, v, _ = a._project(x, None)
        s = (q @ k.transpose(-1, -2)) * (a.head_dim ** -0.5)
        if causal:
            n = x.shape[1]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        return a._merge(torch.softmax(s, dim=-1) @ v)


def attention_sized_value_pom(dim: int, heads: int, degree: int = 2) -> ValuePoM:
    """The value-carrying PoM whose projections cost what attention's do: D = dv = d, split over attention's
    ``heads`` (a D/h × dv/h state per head, as attention's head width), one gate scalar per head. Its input projection
    is d × (2D + dv + h) = d × (3d + h) and its output projection dv × d = d², so a token costs d·(4d + h)
    multiply-adds in projections against attention's 4d² (d = 512, 8 heads: +0.4%). A gate per channel would add d
    rows (5d², +25%); D = 2d, as PoM's, 7d² (+75%, the bench's ``value_pom``)."""
    return ValuePoM(dim, degree=degree, expand=1, value_dim=dim, heads=heads, sel_heads=heads)


def _value_floor(vpom: PoM, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """The value-carrying PoM's matrix products alone: the stacked projection, the state products on the raw key /
    value / query slices (chunked when causal, two products when full), and W_o."""
    D, dv, H = vpom.poly_dim, vpom.value_dim, vpom.heads
    B, N, _ = x.shape
    z = F.linear(x, vpom.in_proj.weight)
    heads = lambda t: t.reshape(B, N, H, -1).transpose(1, 2)  # noqa: E731
    k, v, q = heads(z[..., :D]), heads(z[..., D:D + dv]), heads(z[..., D + dv:2 * D + dv])
    o = value_mix(q, k, v, x.new_ones(B, N), causal=causal, chunk=vpom.chunk_size)[0]
    return F.linear(o.transpose(1, 2).reshape(B, N, dv), vpom.out_proj.weight)


def _on(name: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fn`` run on op backend ``name`` (strict)."""
    def call(x: torch.Tensor) -> torch.Tensor:
        with backend(name):
            return fn(x)
    return call


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class _Layers:
    """The layers a run times, and at the current length their compiled forms by mixer (none without compile)."""

    pom: PoM
    values: Dict[str, PoM]  # "value_pom", "value_pom_att" → layer
    att: Attention
    naive: _NaiveAttention
    compiled: Dict[str, torch.nn.Module] = field(default_factory=dict)

    def modules(self) -> Dict[str, torch.nn.Module]:
        """Every mixer's layer by its key in ``MixerBenchConfig.mixers``."""
        return {"pom": self.pom, **self.values, "attention": self.att}

    def parameters(self) -> List[torch.nn.Parameter]:
        return [p for m in self.modules().values() for p in m.parameters()]


MODES: Tuple[Tuple[str, Dict[str, Any]], ...] = (("full", {}), ("causal", {"causal": True}))
Config = Tuple[Callable[[torch.Tensor], torch.Tensor], bool]


def _pom_configs(cfg: MixerBenchConfig, layers: _Layers, gpu: bool) -> Dict[str, Config]:
    """PoM's floor, and every mode eager (on a GPU: the torch form and both Triton routes) and compiled."""
    pom = layers.pom
    D, w_in, w_out = pom.poly_dim, pom.in_proj.weight, pom.out_proj.weight
    # PoM's own matrix products alone — its floor: x → [W_h x; W_s x] (d → D + Ds), then (B, N, D) → d
    out: Dict[str, Config] = {"pom matmuls (floor)": (lambda x: F.linear(F.linear(x, w_in)[..., :D], w_out), True)}
    for mode, kw in MODES:  # on a GPU "pom <mode>" is the torch form, beside both Triton routes
        out[f"pom {mode}"] = (_on("torch", lambda x, kw=kw: pom(x, **kw)) if gpu else lambda x, kw=kw: pom(x, **kw),
                              True)
    if gpu and _triton_available():
        for mode, kw in MODES:
            for route in ("triton", "triton_gemm"):
                out[f"pom {mode} {route}"] = (_on(route, lambda x, kw=kw: pom(x, **kw)), True)
    if "pom" in layers.compiled:
        for mode, kw in MODES:
            out[f"pom {mode} compiled"] = (lambda x, kw=kw: layers.compiled["pom"](x, **kw), True)
    return out


def _value_configs(key: str, layers: _Layers, gpu: bool) -> Dict[str, Config]:
    """A value PoM's floors (causal, full), and every mode eager (on a GPU: the torch form and the kernels) and
    compiled."""
    v, name = layers.values[key], VALUE_ROWS[key]
    out: Dict[str, Config] = {f"{name} matmuls (floor)": (lambda x: _value_floor(v, x), True),
                              f"{name} matmuls full (floor)": (lambda x: _value_floor(v, x, causal=False), True)}
    for mode, kw in MODES:
        out[f"{name} {mode}"] = (_on("torch", lambda x, kw=kw: v(x, **kw)) if gpu else lambda x, kw=kw: v(x, **kw),
                                 True)
        if gpu and _triton_available():
            out[f"{name} {mode} triton"] = (_on("triton", lambda x, kw=kw: v(x, **kw)), True)
        if key in layers.compiled:
            out[f"{name} {mode} compiled"] = (lambda x, kw=kw: layers.compiled[key](x, **kw), True)
    return out


def _attention_configs(cfg: MixerBenchConfig, B: int, N: int, layers: _Layers) -> Dict[str, Config]:
    """SDPA (FlashAttention in bf16 on a GPU) eager and compiled, and the textbook N × N attention where its scores
    fit ``naive_max_gb``."""
    att, naive = layers.att, layers.naive
    out: Dict[str, Config] = {}
    for mode, kw in MODES:
        out[f"sdpa {mode}"] = (lambda x, kw=kw: att(x, **kw), True)
    if "attention" in layers.compiled:
        for mode, kw in MODES:
            out[f"sdpa {mode} compiled"] = (lambda x, kw=kw: layers.compiled["attention"](x, **kw), True)
    score_gb = B * cfg.heads * N * N * 4 / 1e9
    if cfg.naive and 2 * score_gb <= cfg.naive_max_gb:
        for mode, kw in MODES:
            out[f"naive {mode}"] = (lambda x, kw=kw: naive(x, **kw), 6 * score_gb <= cfg.naive_max_gb)
    return out


def _configs(cfg: MixerBenchConfig, N: int, B: int, layers: _Layers) -> Dict[str, Config]:
    """name → (forward function of x, allowed with backward), for every mixer of ``cfg.mixers`` at length N."""
    gpu = cfg.device.startswith("cuda")
    out: Dict[str, Config] = {}
    if "pom" in cfg.mixers:
        out.update(_pom_configs(cfg, layers, gpu))
    for key in VALUE_ROWS:
        if key in cfg.mixers:
            out.update(_value_configs(key, layers, gpu))
    if N in cfg.lengths and "attention" in cfg.mixers:
        out.update(_attention_configs(cfg, B, N, layers))
    return out


def run_dtype(device: str, dtype: str) -> str:
    """The dtype a run times in: ``dtype``, or for "auto" fp32 on the CPU and bf16 on a GPU."""
    return dtype if dtype != "auto" else ("bf16" if device.startswith("cuda") else "fp32")


def _floor_of(name: str) -> str:
    """The floor row a row's time is divided by: its value PoM's matrix products (causal or full), else PoM's."""
    for prefix in sorted(VALUE_ROWS.values(), key=len, reverse=True):
        if name.startswith(prefix):
            return f"{prefix} matmuls {'full ' if ' full' in name else ''}(floor)"
    return "pom matmuls (floor)"


def _compiled_at(cfg: MixerBenchConfig, N: int) -> bool:
    return cfg.compile and (cfg.compile_lengths is None or N in cfg.compile_lengths)


def _build(cfg: MixerBenchConfig, dev: torch.device, dtype: torch.dtype) -> _Layers:
    d = cfg.dim
    values = {"value_pom": ValuePoM(d, degree=cfg.degree, expand=cfg.expand, value_dim=cfg.value_dim,
                                    heads=cfg.value_heads),
              "value_pom_att": attention_sized_value_pom(d, cfg.heads, cfg.degree)}
    att = Attention(d, heads=cfg.heads).to(dev, dtype)
    layers = _Layers(PoM(d, degree=cfg.degree, expand=cfg.expand).to(dev, dtype),
                     {k: v.to(dev, dtype) for k, v in values.items()}, att, _NaiveAttention(att))
    for p in layers.parameters():
        p.requires_grad_(True)
    return layers


def run(cfg: MixerBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Run the sweep; returns the JSON payload (also written to ``cfg.out`` after every length) with rows and a
    summary."""
    from tqdm.auto import tqdm

    torch.manual_seed(cfg.seed)
    dev = torch.device(cfg.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but PyTorch sees no CUDA device here")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[run_dtype(cfg.device, cfg.dtype)]
    layers = _build(cfg, dev, dtype)
    lengths = sorted(set(cfg.lengths) | set(cfg.pom_lengths))
    plans = [(N, max(1, cfg.tokens // N)) for N in lengths]
    cores = os.cpu_count() or 1
    busy = hasattr(os, "getloadavg") and os.getloadavg()[0] / cores > MachineLoad.BUSY_LOAD
    repeats = 2 * cfg.repeats - 1 if busy else cfg.repeats  # more samples for the medians on a busy machine
    threads = torch.get_num_threads()
    if busy and dev.type == "cpu" and threads > 1:  # one thread per process is steadier beside other work: a
        torch.set_num_threads(1)                    # parallel region waits for its slowest thread
    out = Path(cfg.out)
    kept: List[Dict[str, Any]] = []
    if set(cfg.mixers) != set(MIXERS) and (out / "mixer.json").is_file():
        kept = [r for r in read_json(out / "mixer.json").get("rows", []) if _owner(r["mixer"])
                not in cfg.mixers]  # the rows of mixers not run again (read now: this run rewrites the file)

    def calls(N: int, B: int) -> int:
        """Every call a length makes: warm-up and repeats of each configuration, one more for its memory, per
        phase (forward, and forward + backward)."""
        compiled = _compiled_at(cfg, N)
        counted = _Layers(layers.pom, layers.values, layers.att, layers.naive,
                          {k: torch.nn.Identity() for k in MIXERS} if compiled else {})
        names = _configs(cfg, N, B, counted)
        per = repeats + cfg.warmup + (1 if compiled else 0) + 1
        return len(names) * per + (sum(ok for _, ok in names.values()) * per if cfg.backward else 0)

    total = sum(calls(N, B) for N, B in plans)
    if "value_pom" in cfg.mixers:
        total += 3 * (repeats + cfg.warmup) * len(cfg.packed_layouts)
    bar = tqdm(total=total, disable=not progress, desc="bench mixer", unit="call", dynamic_ncols=True)

    rows: List[Dict[str, Any]] = []
    skipped: Dict[str, str] = {}  # configuration -> why it could not run
    load = MachineLoad().__enter__()
    facts = {"repeats": repeats, "busy_at_start": bool(busy), "threads": 1 if busy and dev.type == "cpu" else threads,
             "params": {k: count_parameters(m) for k, m in layers.modules().items()},
             "gpu": gpu_facts(dev) if dev.type == "cuda" else None}
    for N, B in plans:
        with recompile_limit():
            rows += _measure_length(cfg, layers, N, B, dev, dtype, repeats, bar, skipped)
        write_json(out / "mixer.json", _payload(cfg, kept + rows, facts, skipped, None, busy, partial=True))
    packed = (run_packed(cfg, layers.values["value_pom"], repeats, bar)
              if "value_pom" in cfg.mixers and cfg.packed_layouts else None)
    bar.close()
    load.__exit__(None, None, None)
    torch.set_num_threads(threads)
    payload = _payload(cfg, kept + rows, facts, skipped, packed, bool(busy) or load.warning() is not None)
    write_json(out / "mixer.json", payload)
    write_report(payload, out)
    return payload


def _payload(cfg: MixerBenchConfig, rows: List[Dict[str, Any]], facts: Dict[str, Any], skipped: Dict[str, str],
             packed: Optional[List[Dict[str, Any]]], busy: bool, partial: bool = False) -> Dict[str, Any]:
    """The JSON of a run: its rows by length, the summary, the machine (and the GPU: name, ``arch`` such as
    "sm_90"), and what could not run; ``partial`` while lengths are still to come."""
    rows = sorted(rows, key=lambda r: r["N"])
    payload = {"config": asdict(cfg), "machine": {**machine(), **_kernel_hashes()}, "rows": rows,
               "summary": summarize(cfg, rows), **facts, "busy": busy}
    if partial:
        payload["partial"] = True
    if packed is not None:
        payload["packed"] = packed
    if skipped:
        payload["skipped"] = skipped
    return payload


def _kernel_hashes() -> Dict[str, Any]:
    """``{"kernels": {op: hash}}``: the kernel source a run measured (the dispatch table's entries apply to it
    alone), or nothing where this build has no such record."""
    try:
        from ...ops import measured
    except ImportError:
        return {}
    return {"kernels": {op: measured.kernel_hash(op) for op in measured.KERNEL_FILES}}


def _measure_length(cfg: MixerBenchConfig, layers: _Layers, N: int, B: int, dev: torch.device, dtype: torch.dtype,
                    repeats: int, bar: Any, skipped: Dict[str, str]) -> List[Dict[str, Any]]:
    """Every configuration at length N (batch B): forward and forward + backward times, their peak memory and their
    ratios to the floors. A configuration that a strict backend refuses, or that runs out of memory, is listed in
    ``skipped`` and the others still run."""
    layers.compiled = {}
    if _compiled_at(cfg, N):
        torch._dynamo.reset()  # fresh static graphs for every shape: the best case, and no recompile limit
        layers.compiled = {k: torch.compile(m, fullgraph=True, dynamic=False) for k, m in layers.modules().items()
                           if k in cfg.mixers}
    x = torch.randn(B, N, cfg.dim, device=dev, dtype=dtype)
    configs = _configs(cfg, N, B, layers)

    def tick(name: str) -> None:
        bar.set_postfix_str(f"N={N} {name}")
        bar.update(1)

    def measured(fns: Dict[str, Callable[[], Any]]) -> Dict[str, Optional[float]]:
        out = {}
        gc.collect()  # once for the group: the calls below leave no cyclic garbage behind
        for k, f in fns.items():
            out[k] = peak_memory_mb(f, dev, collect=False)
            tick(k + " (memory)")
        return out

    warm = cfg.warmup + (1 if layers.compiled else 0)

    def refused(k: str, call: Callable[[], Any]) -> bool:
        """Whether a configuration cannot run here (a strict backend that refuses the call, e.g. kernels that
        failed their first-use check, or too little memory): it is reported, not timed, and the others still run."""
        try:
            call()
            return False
        except NotImplementedError as e:
            skipped.setdefault(k, str(e))
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
            if failure(e) is None:
                raise
            skipped[f"{k} (N = {N})"] = failure(e)
            release_memory(dev)
        configs.pop(k, None)
        return True

    def timed(fns: Dict[str, Callable[[], Any]]) -> Tuple[Dict[str, Any], Dict[str, Optional[float]]]:
        fns = {k: f for k, f in fns.items() if not refused(k, f)}
        for _ in range(warm):  # the warm-up calls, on the bar too
            for k, f in fns.items():
                f()
                tick(k + " (warm-up)")
        return time_interleaved(fns, warmup=0, repeats=repeats, on_sample=tick), measured(fns)

    with torch.no_grad():
        t_fwd, mem_fwd = timed({k: synchronized(lambda f=f: f(x), dev) for k, (f, _) in configs.items()})
    t_bwd: Dict[str, Any] = {}
    mem_bwd: Dict[str, Optional[float]] = {}
    if cfg.backward:
        xg = x.clone().requires_grad_(True)
        params = layers.parameters()
        t_bwd, mem_bwd = timed({k: synchronized(_train_step(f, params, xg), dev) for k, (f, ok) in configs.items()
                                if ok})
    rows = _length_rows(N, B, t_fwd, t_bwd, mem_fwd, mem_bwd)
    layers.compiled = {}
    return rows


def _train_step(f: Callable, params: List[torch.Tensor], x: torch.Tensor) -> Callable[[], None]:
    """One timed training call of mixer ``f``: clear the gradients of ``params`` and ``x``, forward, backward."""
    def step() -> None:
        for p in params + [x]:
            p.grad = None
        y = f(x)
        y.backward(torch.ones_like(y))
    return step


def _length_rows(N: int, B: int, t_fwd: Dict[str, Any], t_bwd: Dict[str, Any], mem_fwd: Dict[str, Optional[float]],
                 mem_bwd: Dict[str, Optional[float]]) -> List[Dict[str, Any]]:
    """The rows of length N (batch B): each configuration's forward and forward + backward times, throughput, peak
    memory and ratios to its floor's times. A configuration refused only with backward keeps its forward row."""
    rows = []
    for k in t_fwd:
        base = _floor_of(k)
        floor = t_fwd[base].median if base in t_fwd else float("nan")
        floor_b = t_bwd[base].median if base in t_bwd else float("nan")
        tf = t_fwd[k].median
        tb = t_bwd[k].median if k in t_bwd else None
        rows.append({
            "N": N, "batch": B, "mixer": k,
            "fwd_ms": 1e3 * tf, "fwd_spread": t_fwd[k].spread, "fwd_tok_s": B * N / tf,
            "fwd_samples_ms": [1e3 * v for v in t_fwd[k].samples],
            "fwd_vs_floor": tf / floor,
            "fwdbwd_ms": None if tb is None else 1e3 * tb,
            "fwdbwd_vs_floor": None if tb is None else tb / floor_b,
            "fwd_peak_mb": mem_fwd.get(k), "fwdbwd_peak_mb": mem_bwd.get(k),
        })
    return rows


def run_packed(cfg: MixerBenchConfig, vpom: PoM, repeats: int, bar: Any = None) -> List[Dict[str, Any]]:
    """Causal packed sequences (``cu_seqlens``) through the value PoM, forward + backward: in place, as the same
    sequences padded into a (S, L_max) batch with a key mask, and as one unpacked sequence of the same tokens."""
    from ...values import pad_packed

    rows = []
    p = next(vpom.parameters())
    for lens in cfg.packed_layouts:
        T = sum(lens)
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=p.device)
        x = torch.randn(1, T, cfg.dim, device=p.device, dtype=p.dtype, requires_grad=True)
        rows_x, valid = pad_packed(x.detach(), cu)
        padded = rows_x.clone().requires_grad_(True)

        def step(f: Callable[[], torch.Tensor]) -> Callable[[], None]:
            return lambda: f().sum().backward()

        t = time_interleaved({"in place": synchronized(step(lambda: vpom(x, cu_seqlens=cu, causal=True)), p.device),
                              "padded batch": synchronized(step(lambda: vpom(padded, mask=valid, causal=True)),
                                                           p.device),
                              "one sequence": synchronized(step(lambda: vpom(x, causal=True)), p.device)},
                             warmup=cfg.warmup, repeats=repeats,
                             on_sample=None if bar is None else lambda k: (bar.set_postfix_str(f"packed {k}"),
                                                                           bar.update(1)))
        if bar is not None:
            bar.update(3 * cfg.warmup)  # the warm-up calls time_interleaved made
        name = " + ".join(f"{c} × {n}" for n, c in _runs(lens))  # count × length
        for k, v in t.items():
            rows.append({"layout": name, "tokens": T, "sequences": len(lens), "mode": k,
                         "fwdbwd_ms": 1e3 * v.median, "vs_one_sequence": v.median / t["one sequence"].median})
    return rows


def _runs(lens: Tuple[int, ...]) -> List[Tuple[int, int]]:
    """(length, count) runs of a layout, for its name."""
    return [(n, len(list(g))) for n, g in itertools.groupby(lens)]


def _owner(name: str) -> str:
    """The mixer a row belongs to: "pom", "value_pom", "value_pom_att" or "attention"."""
    for key, prefix in sorted(VALUE_ROWS.items(), key=lambda kv: len(kv[1]), reverse=True):
        if name.startswith(prefix):
            return key
    return "pom" if name.startswith("pom") else "attention"


def _lookup(rows: List[Dict[str, Any]], N: int, mixer: str, key: str) -> Optional[float]:
    for r in rows:
        if r["N"] == N and r["mixer"] == mixer:
            return r.get(key)
    return None


def _crossover(rows: List[Dict[str, Any]], a: str, b: str) -> Optional[str]:
    """Sequence length where mixer ``a`` becomes faster than ``b`` (log-interpolated between measured lengths)."""
    pts = sorted({r["N"] for r in rows if r["mixer"] == b})
    ratios = [(n, _lookup(rows, n, a, "fwd_ms") / _lookup(rows, n, b, "fwd_ms")) for n in pts
              if _lookup(rows, n, a, "fwd_ms") is not None]
    if not ratios:
        return None
    if ratios[0][1] < 1:
        return f"< {ratios[0][0]}"
    for (n0, r0), (n1, r1) in zip(ratios, ratios[1:]):
        if r0 >= 1 > r1:
            t = math.log(r0) / (math.log(r0) - math.log(r1))
            return f"{math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0))):.0f}"
    return f"> {ratios[-1][0]}"


def _quartiles(rows: List[Dict[str, Any]], N: int, mixer: str) -> Optional[Tuple[float, float]]:
    """(lower, upper) quartile of a row's forward samples (its median twice for rows without samples)."""
    for r in rows:
        if r["N"] == N and r["mixer"] == mixer:
            xs = r.get("fwd_samples_ms") or [r["fwd_ms"]]
            if len(xs) < 4:
                return min(xs), max(xs)
            q = statistics.quantiles(xs, n=4)
            return q[0], q[2]
    return None


def ratio_verdict(rows: List[Dict[str, Any]], N: int, a: str, b: str, at_most: float) -> str:
    """Whether time(a) ÷ time(b) ≤ ``at_most`` at N, judged on the spread of the repeats, not the medians alone:
    "met" when even a's upper quartile over b's lower one is within the bound, "MISSED" when even a's lower quartile
    over b's upper one exceeds it; otherwise what the medians say and that the repeats, straddling the bound, do not
    separate it from the bound ("met by the medians, not separated: …")."""
    qa, qb = _quartiles(rows, N, a), _quartiles(rows, N, b)
    if qa is None or qb is None:
        return "not run"
    low, high = qa[0] / qb[1], qa[1] / qb[0]
    if high <= at_most:
        return "met"
    if low > at_most:
        return "MISSED"
    medians = "met" if _ratio(rows, N, a, b, "fwd_ms") <= at_most else "missed"
    return (f"{medians} by the medians, not separated: the repeats give {low:.2f}–{high:.2f} across the bound (a busy "
            f"machine? run it alone)")


def _unless_busy(payload: Dict[str, Any], verdict: str) -> str:
    """A miss measured while other work shared the cores is still the measured miss, said with its caveat."""
    if verdict == "MISSED" and payload.get("busy"):
        return "MISSED while other work shared the cores: run it alone before reading it as PoM's"
    return verdict


def summarize(cfg: MixerBenchConfig, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Ratios against the targets, the predicted and measured crossovers."""
    s: Dict[str, Any] = {"predicted_crossover": predicted_crossover(cfg.dim, round(cfg.expand * cfg.dim), cfg.degree)}
    for mode in ("full", "causal"):
        s[f"measured_crossover_{mode}"] = _crossover(rows, f"pom {mode}", f"sdpa {mode}")
        for variant in ("", " compiled"):
            key = f"pom {mode}{variant}"
            s[f"{key} / floor @4096"] = _lookup(rows, 4096, key, "fwd_vs_floor")
        speedups = {}
        for n in sorted({r["N"] for r in rows if r["mixer"] == f"sdpa {mode}"}):
            p, a = _lookup(rows, n, f"pom {mode}", "fwd_ms"), _lookup(rows, n, f"sdpa {mode}", "fwd_ms")
            if p is not None and a is not None:
                speedups[n] = a / p
        s[f"sdpa/pom {mode} speedup by N"] = speedups
    for prefix in VALUE_ROWS.values():
        for mode in ("causal", "full"):
            for variant in ("", " compiled"):
                key = f"{prefix} {mode}{variant}"
                s[f"{key} / floor by N"] = {r["N"]: (r["fwd_vs_floor"], r["fwdbwd_vs_floor"]) for r in rows
                                            if r["mixer"] == key}
    for mode in ("full", "causal"):  # the value PoM at attention's size against attention, forward / fwd + bwd
        s[f"sdpa/value pom att-sized {mode} speedup by N"] = {
            n: tuple(_ratio(rows, n, f"sdpa {mode}", f"value pom att-sized {mode}", key)
                     for key in ("fwd_ms", "fwdbwd_ms"))
            for n in sorted({r["N"] for r in rows if r["mixer"] == f"value pom att-sized {mode}"})
            if _lookup(rows, n, f"sdpa {mode}", "fwd_ms") is not None}
    return s


def _ratio(rows: List[Dict[str, Any]], N: int, a: str, b: str, key: str) -> Optional[float]:
    """``key`` of row a ÷ ``key`` of row b at N (None where either is missing)."""
    x, y = _lookup(rows, N, a, key), _lookup(rows, N, b, key)
    return None if x is None or y is None else x / y


# the report's columns: (row key, header); a column no row has a value for is left out (--quick: the forward only)
COLUMNS = (("N", "N"), ("batch", "B"), ("mixer", "mixer"), ("fwd_ms", "fwd ms"), ("fwd_tok_s", "fwd tok/s"),
           ("fwd_vs_floor", "fwd ÷ floor"), ("fwdbwd_ms", "fwd+bwd ms"), ("fwdbwd_vs_floor", "fwd+bwd ÷ floor"),
           ("fwd_peak_mb", "fwd MB"), ("fwdbwd_peak_mb", "fwd+bwd MB"))


# what each mixer of a run is, for its report's header
MIXER_NAMES = {"pom": "PoM", "value_pom": "the value PoM", "value_pom_att": "the value PoM at attention's size",
               "attention": "attention"}


def header(payload: Dict[str, Any]) -> str:
    """What a run measured, in words (its report's first lines): the layers and their sizes, the tokens of each call
    and how they split into batch × length, what was timed and how, the dtype, the device and torch."""
    c, m, rows = _config(payload), payload["machine"], payload["rows"]
    sizes = {"pom": f" (D = {round(c['expand'] * c['dim']):,}, degree {c['degree']})",
             "value_pom": f" (dv = {c['value_dim']}, {c['value_heads']} heads)",
             "attention": f" ({c['heads']} heads: SDPA{' and the naive N × N form' if c['naive'] else ''})"}
    owners = [k for k in MIXERS if any(_owner(r["mixer"]) == k for r in rows)]
    within = ", ".join(f"{B} × {N:,}" for N, B in sorted({(r["N"], r["batch"]) for r in rows if r["N"] <= c["tokens"]}))
    beyond = sorted({r["N"] for r in rows if r["N"] > c["tokens"]})
    where = f"GPU {payload['gpu']['name']}" if payload.get("gpu") else f"CPU {m['cpu']} with {_threads(payload)}"
    lines = [f"bench mixer: one mixing layer with its projections, d = {c['dim']}: "
             + ", ".join(MIXER_NAMES[k] + sizes.get(k, "") for k in owners),
             f"{c['tokens']:,} tokens per call, batch × length: {within}"
             + (f"; PoM alone beyond: one sequence of {', '.join(f'{n:,}' for n in beyond)}" if beyond else ""),
             f"timed: {'forward and forward + backward' if c['backward'] else 'the forward pass only'}, "
             f"{'eager and under torch.compile' if c['compile'] else 'eager (no torch.compile)'}; the median of "
             f"{payload.get('repeats', c['repeats'])} interleaved repeats after {c['warmup']} warm-up call(s)",
             f"{run_dtype(c['device'], c['dtype'])} on the {where}; torch {m['torch']}"]
    earlier = [MIXER_NAMES[k] for k in owners if k not in c["mixers"]]
    if earlier:  # (--mixers times some mixers again and keeps the others' rows)
        lines.append(f"the rows of {' and '.join(earlier)} come from an earlier run into this folder (that run's "
                     f"repeats and threads)")
    return "\n".join(textwrap.fill(t, 120, initial_indent="  " if i else "", subsequent_indent="    ")
                     for i, t in enumerate(lines))


def _config(payload: Dict[str, Any]) -> Dict[str, Any]:
    """A run's config, with today's defaults for settings older runs did not record."""
    return {**asdict(MixerBenchConfig()), **payload["config"]}


def _memory_note(payload: Dict[str, Any]) -> List[str]:
    """What the fwd MB column counts, and why the floor needs more than PoM: its projection held whole."""
    c = _config(payload)
    size = 2 if run_dtype(c["device"], c["dtype"]) == "bf16" else 4
    mib = lambda floats: f"{floats * size / 2**20:,.0f} MiB"  # noqa: E731
    T, d, D = c["tokens"], c["dim"], round(c["expand"] * c["dim"])
    note = (f"fwd MB: the peak tensor memory one forward call allocates beyond its input and weights (MiB), its "
            f"output included ({T:,} tokens × {d} = {mib(T * d)}). The floor holds its whole input projection beside "
            f"it ({T:,} × {2 * D:,}, D and the gate: {mib(T * 2 * D)}), {mib(T * (2 * D + d))} in all; SDPA its "
            f"queries, keys, values and the heads' outputs ({T:,} × {4 * d:,}: {mib(T * 4 * d)})")
    if not c["device"].startswith("cuda"):
        note += "; PoM's fused CPU path projects and mixes a tile of tokens at a time"
    return textwrap.wrap(note + ".", 120)


def report(payload: Dict[str, Any]) -> str:
    """The printed report: what was measured, the table (the columns measured), crossovers and the targets."""
    rows = payload["rows"]
    shown = [(k, h) for k, h in COLUMNS if any(r.get(k) is not None for r in rows)]
    s = payload["summary"]
    lines = [header(payload), "", format_table(rows, [k for k, _ in shown], [h for _, h in shown]), ""]
    if any(k == "fwd_peak_mb" for k, _ in shown):
        lines += _memory_note(payload) + [""]
    gpu = payload.get("gpu")
    if gpu:
        lines.append(f"GPU: {gpu['name']} ({gpu['arch']}, {gpu['sms']} SMs), CUDA {gpu['cuda']}, Triton "
                     f"{gpu['triton']}, driver {gpu['driver']}")
    timed = {_owner(r["mixer"]) for r in rows}
    if payload.get("params"):  # of the mixers in the table only
        lines.append("parameters per layer: " + ", ".join(f"{k} {v:,}" for k, v in payload["params"].items()
                                                          if k in timed))
    if payload.get("partial"):
        lines.append("PARTIAL: the run stopped before its last length")
    for k, why in payload.get("skipped", {}).items():
        lines.append(f"not timed: {k} — {why}")
    if payload.get("busy_at_start"):
        lines.append(f"the machine was busy when this started: {payload.get('repeats')} repeats, "
                     f"{_threads(payload)}; a miss measured beside other work says so")
    lines.append(f"crossover (PoM cheaper than attention): paper's cost model n ≥ {s['predicted_crossover']:.0f}; "
                 f"measured here: full {s['measured_crossover_full']}, causal {s['measured_crossover_causal']}")
    checks = [("pom full", 1.25), ("pom full compiled", 1.25), ("pom causal", 1.4), ("pom causal compiled", 1.4)]
    for name, target in checks:
        v = s.get(f"{name} / floor @4096")
        if v is not None:
            verdict = _unless_busy(payload, ratio_verdict(rows, 4096, name, "pom matmuls (floor)", target))
            lines.append(f"{name} / floor @4096: {v:.3f}  (target ≤ {target}: {verdict})")
    for prefix in VALUE_ROWS.values():
        for mode in ("causal", "full"):
            for variant in ("", " compiled"):
                by_n = {int(k): v for k, v in s.get(f"{prefix} {mode}{variant} / floor by N", {}).items()}
                if by_n:
                    txt = ", ".join(f"{n}: {f:.2f} / {b:.2f}" if b is not None else f"{n}: {f:.2f}"
                                    for n, (f, b) in sorted(by_n.items()))
                    lines.append(f"{prefix} {mode}{variant} ÷ its matrix-product floor (fwd / fwd+bwd) by N: {txt}")
    for mode in ("full", "causal"):
        by_n = {int(k): v for k, v in s.get(f"sdpa/value pom att-sized {mode} speedup by N", {}).items()}
        if by_n:
            txt = ", ".join(f"{n}: {_times(f)} / {_times(b)}" for n, (f, b) in sorted(by_n.items()))
            lines.append(f"value pom att-sized {mode} speed-up over SDPA (fwd / fwd+bwd) by N: {txt}")
    if payload.get("packed"):
        lines += ["", "value PoM, packed causal sequences, forward + backward:",
                  format_table(payload["packed"], ["layout", "tokens", "mode", "fwdbwd_ms", "vs_one_sequence"],
                               ["sequences", "tokens", "mixed", "fwd+bwd ms", "÷ one sequence"]), ""]
    for mode in ("full", "causal"):
        sp = {int(k): v for k, v in s[f"sdpa/pom {mode} speedup by N"].items()}
        if sp:
            # PoM faster than SDPA: time(PoM) ÷ time(SDPA) < 1, judged on the repeats' spread
            judged = {n: ratio_verdict(rows, n, f"pom {mode}", f"sdpa {mode}", 1.0) for n in sp if n >= 2048}
            txt = ", ".join(f"{n}: {v:.2f}×" for n, v in sorted(sp.items()))
            lines.append(f"PoM {mode} speed-up over SDPA by N: {txt}")
            if judged:
                if all(v == "met" for v in judged.values()):
                    verdict = "met"
                elif any(v == "MISSED" for v in judged.values()):
                    verdict = _unless_busy(payload, "MISSED")
                else:
                    verdict = "not separated: the repeats of PoM and SDPA overlap (a busy machine? run it alone)"
                lines.append(f"  faster at every N ≥ 2048: {verdict}")
            if 16384 in sp:
                lines.append(f"  ≥ 5× at N = 16384: {sp[16384]:.2f}× ({'met' if sp[16384] >= 5 else 'MISSED'})")
    return "\n".join(lines)


def _times(v: Optional[float]) -> str:
    return "—" if v is None else f"{v:.2f}×"


def _threads(payload: Dict[str, Any]) -> str:
    """The threads the timings ran with (one on a busy machine), in words."""
    n = payload.get("threads", payload["machine"].get("torch_threads"))
    return f"{n} thread{'s' if n != 1 else ''}"


def plot(payload: Dict[str, Any], path: Path) -> None:
    """Time for a fixed token budget against sequence length (log-x), forward and forward+backward, and memory."""
    rows = payload["rows"]
    cfg = payload["config"]
    mixers = list(dict.fromkeys(r["mixer"] for r in rows))
    style = {"pom": "-", "value": "-.", "sdpa": "--", "naive": ":"}
    panels = [(key, title) for key, title in (("fwd_ms", "forward"), ("fwdbwd_ms", "forward + backward"),
                                              ("fwdbwd_peak_mb", "peak tensor memory, forward + backward"))
              if any(r.get(key) is not None for r in rows)]  # only what was measured (--quick: the forward)
    fig, axes = new_figure(max(1, len(panels)))
    budget = cfg["tokens"]
    for ax, (key, title) in zip(axes, panels):
        for m in mixers:
            # normalised to the token budget: lengths beyond it (PoM only) run one sequence of N > budget tokens
            pts = [(r["N"], r[key] * budget / (r["N"] * r["batch"])) for r in rows
                   if r["mixer"] == m and r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, style.get(m.split()[0], "-"), marker="o", ms=3, label=m)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(("MB" if key.endswith("mb") else "ms") + f" per {budget:,} tokens")
        ax.set_title(title)
        ax.axvline(payload["summary"]["predicted_crossover"], color="grey", lw=0.8, ls="-.")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    c = _config(payload)
    where = payload["gpu"]["name"] if payload.get("gpu") else f"{payload['machine']['cpu']}, {_threads(payload)}"
    figure_title(fig, f"PoM vs attention: one layer, d = {c['dim']} (PoM D = {round(c['expand'] * c['dim']):,}, "
                      f"degree {c['degree']}), {budget:,} tokens per call, {run_dtype(c['device'], c['dtype'])} — "
                      f"{where}, torch {payload['machine']['torch']}. Dash-dot: the paper's predicted crossover "
                      f"(N = {payload['summary']['predicted_crossover']:.0f})")
    save_figure(fig, path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = MixerBenchConfig()
    size, count = int_at_least(1), int_at_least(0)
    p.add_argument("--quick", action="store_true",
                   help="the README's rows in 1–2 minutes: N = 1,024 and 4,096 at a 16k-token budget, forward, PoM "
                        "and its floor against SDPA, eager, 7 interleaved repeats (13 on a busy machine); written to "
                        f"{d.out}-quick unless --out says otherwise")
    p.add_argument("--report", action="store_true",
                   help="time nothing: write mixer.txt and mixer.png again from the mixer.json in --out")
    p.add_argument("--dim", type=size, default=d.dim)
    p.add_argument("--expand", type=float_in(Range(0, low_open=True)), default=d.expand)
    p.add_argument("--degree", type=size, default=d.degree)
    p.add_argument("--heads", type=size, default=d.heads, help="attention heads of the baselines")
    p.add_argument("--tokens", type=size, default=d.tokens, help="token budget per call (batch = tokens / N)")
    p.add_argument("--lengths", type=size, nargs="+", default=None, help="sequence lengths for every mixer")
    p.add_argument("--pom-lengths", type=size, nargs="*", default=None, help="extra lengths for PoM only")
    p.add_argument("--repeats", type=size, default=None)
    p.add_argument("--warmup", type=count, default=None)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile columns")
    p.add_argument("--no-backward", action="store_true", help="time the forward pass only")
    p.add_argument("--naive-max-gb", type=float_in(Range(0, low_open=True)), default=d.naive_max_gb)
    p.add_argument("--mixers", nargs="+", choices=list(MIXERS), default=None,
                   help="mixers to time (default all; value_pom_att: the value PoM at attention's size, D = dv = dim "
                        "over --heads heads, a gate per head); the rows of the others are kept from the earlier "
                        "mixer.json")
    p.add_argument("--compile-lengths", type=size, nargs="*", default=None,
                   help="the lengths that get the torch.compile columns (default: every length; each length "
                        "compiles every layer afresh, which takes most of a GPU run's time)")
    p.add_argument("--value-dim", type=size, default=d.value_dim, help="value-carrying PoM: dv")
    p.add_argument("--value-heads", type=size, default=d.value_heads, help="value-carrying PoM: heads")
    p.add_argument("--seed", type=count, default=d.seed)
    p.add_argument("--device", default=d.device,
                   help="cpu, or cuda: time on the GPU, with the Triton kernels beside eager and compiled PoM and "
                        "SDPA (FlashAttention in bf16)")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default=d.dtype,
                   help="auto: fp32 on the CPU, bf16 on a GPU")
    p.add_argument("--out", default=d.out, help="folder for mixer.json, mixer.txt and mixer.png")


def write_report(payload: Dict[str, Any], out: Path) -> None:
    """mixer.txt and mixer.png of a run's payload into ``out`` (mixer.json is the run's own)."""
    (out / "mixer.txt").write_text(report(payload) + "\n")
    plot(payload, out / "mixer.png")


def main(args: argparse.Namespace) -> int:
    cfg = MixerBenchConfig(dim=args.dim, expand=int(args.expand) if float(args.expand).is_integer() else args.expand,
                           degree=args.degree, heads=args.heads, tokens=args.tokens, compile=not args.no_compile,
                           backward=not args.no_backward, naive_max_gb=args.naive_max_gb, seed=args.seed,
                           value_dim=args.value_dim, value_heads=args.value_heads, device=args.device,
                           dtype=args.dtype, out=args.out)
    apply_overrides(cfg, QUICK if args.quick else None, args,
                    {name: name for name in ("lengths", "pom_lengths", "repeats", "warmup", "mixers",
                                             "compile_lengths")})
    if args.quick and args.out == MixerBenchConfig.out:  # its own folder: no rows of an earlier full sweep mixed in
        cfg.out = MixerBenchConfig.out + "-quick"
    out = Path(cfg.out)
    if args.report:
        if not (out / "mixer.json").is_file():
            raise ValueError(f"{out / 'mixer.json'}: no bench results to report (run polymixer bench mixer first)")
        payload = read_json(out / "mixer.json")
        write_report(payload, out)
    else:
        payload = run(cfg)
    print(report(payload))
    print(f"\nwrote {out / 'mixer.json'}, mixer.txt and mixer.png" if not args.report else
          f"\nwrote {out / 'mixer.txt'} and mixer.png")
    return 0
