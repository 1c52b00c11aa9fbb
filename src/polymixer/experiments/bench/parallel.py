"""``polymixer bench parallel``: context parallelism — what a layer sends, how long it takes and what it holds per
rank, against the sequence length and the number of ranks.

Every configuration runs in P gloo processes on this machine (one thread each; P = 1 is the plain single-process
layer): a causal layer's forward + backward on one sequence of N tokens, each rank holding N / P of them. For PoM, the
value-carrying PoM and attention it reports

- the bytes a rank sends per layer (forward + backward; the mean over the ranks), counted from the tensors the layer
  sends (:class:`polymixer.ops.parallel.ContextParallel`): PoM's do not depend on N, attention's (the keys and values
  of every other rank — what ring attention sends too, in P − 1 steps) grow with it;
- the median step time per rank and the peak tensor memory per rank (PyTorch's allocations, replayed);
- the longest N that fits a memory budget per rank, extrapolated from the measured peak at the longest N run
  (linear in N / P for PoM; attention here materialises its (N / P) × N scores, so quadratic);

and a labelled MODEL of 8 × H100 over NVLink: the same bytes, bf16, at NVLink's bandwidth, beside the layer's GEMM
time. Attention's exchange at lengths whose scores would not fit this machine is counted by running the exchange
alone on the real shapes (rows marked "exchange only").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch

from ..report import format_table, new_figure, save_figure
from .common import machine, peak_memory_mb, read_json, time_interleaved, write_json
from ...ranges import Range
from ..tasks.common import float_in, int_at_least

__all__ = ["ParallelBenchConfig", "ScalingConfig", "run", "report", "nvlink_model", "scaling", "scaling_report",
           "transfer_model", "million", "million_report", "add_arguments", "main"]

MIXERS = ("pom", "value_pom", "attention")


@dataclass
class ParallelBenchConfig:
    dim: int = 512
    expand: int = 2
    heads: int = 8
    value_dim: int = 512
    lengths: Tuple[int, ...] = (4096, 16384, 65536)
    attention_max: int = 8192  # longest N attention runs whole here (its scores are (N/P) × N per rank)
    ranks: Tuple[int, ...] = (1, 2, 4)
    repeats: int = 3
    budget_gb: float = 16.0  # memory per rank for the longest-N extrapolation
    model_gpus: int = 8
    model_lengths: Tuple[int, ...] = (65536, 262144, 1048576)
    out: str = "runs/bench/parallel"


@dataclass
class ScalingConfig:
    """``bench parallel --scaling``: bytes counted per rank and layer call at each P (no timing: the counts do not
    depend on the machine's load), and a labelled model of P up to ``model_ranks``."""

    dim: int = 512
    expand: int = 2
    heads: int = 8
    value_dim: int = 512
    tokens_per_rank: int = 16
    block_size: int = 24  # block-causal: blocks straddle the slices
    ranks: Tuple[int, ...] = (2, 4, 8)
    model_ranks: Tuple[int, ...] = (8, 64, 512, 1024)
    out: str = "runs/bench/parallel"


def free_port() -> int:
    """A TCP port free on this host now, for a local process group's rendezvous (a fixed one collides with any
    other world on the machine, e.g. another test under xdist)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _layer(kind: str, cfg: ParallelBenchConfig) -> torch.nn.Module:
    from ...layers.attention import Attention
    from ...layers.pom import PoM
    from ...layers.value_pom import ValuePoM

    torch.manual_seed(0)
    if kind == "pom":
        return PoM(cfg.dim, expand=cfg.expand, sel_heads=cfg.heads)
    if kind == "value_pom":
        return ValuePoM(cfg.dim, expand=1, value_dim=cfg.value_dim, heads=cfg.heads)
    return Attention(cfg.dim, heads=cfg.heads)


def _worker(rank: int, world: int, port: int, cfg: ParallelBenchConfig, plan: List[Tuple[str, int, bool]],
            out_dir: str) -> None:
    import torch.distributed as dist

    from ...ops.parallel import context_parallel, gather_rows

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows = []
    for kind, N, exchange_only in plan:
        n = N // world
        layer = _layer(kind, cfg)
        x = torch.randn(1, n, cfg.dim, requires_grad=True)
        sent: Dict[str, int] = {}

        def step() -> None:
            with context_parallel() as cp:
                if exchange_only:  # attention's keys and values, as its forward gathers them, and their gradient
                    kv = torch.randn(1, n, cfg.heads, 2 * cfg.dim // cfg.heads, requires_grad=True)
                    rows_, zero = gather_rows(kv, cp, [n] * world, "attention keys and values")
                    torch.cat([zero] + rows_, dim=1).sum().backward()
                else:
                    layer(x, causal=True).square().mean().backward()
            sent["bytes"] = cp.bytes_sent

        timing = time_interleaved({"step": step}, warmup=1, repeats=cfg.repeats)["step"]
        peak = None if exchange_only else peak_memory_mb(step)
        every: List[Any] = [None] * world  # the ranks send unequal shares (the scans): their mean
        dist.all_gather_object(every, sent["bytes"])
        rows.append({"mixer": kind, "N": N, "P": world, "n_per_rank": n, "exchange_only": exchange_only,
                     "bytes_per_rank": sum(every) / world if world > 1 else 0, "step_s": timing.median,
                     "spread": timing.spread, "peak_mb": peak})
        dist.barrier()
    if rank == 0:
        Path(out_dir, f"ranks{world}.json").write_text(json.dumps(rows))
    dist.destroy_process_group()


def _plan(cfg: ParallelBenchConfig, world: int) -> List[Tuple[str, int, bool]]:
    plan = []
    for N in cfg.lengths:
        if N % world:
            continue
        plan += [("pom", N, False), ("value_pom", N, False)]
        if N <= cfg.attention_max:
            plan.append(("attention", N, False))
        elif world > 1:
            plan.append(("attention", N, True))
    return plan


MODES = {"full": {}, "causal": {"causal": True}, "block-causal": {"causal": True, "block_size": None}}
# links of the model (assumed, not measured): per-message latency α and bandwidth β per GPU and direction
LINKS = {"NVLink (≤ 8 GPUs, one node)": (3e-6, 450e9), "InfiniBand NDR (across nodes)": (8e-6, 50e9)}


def _scaling_layer(kind: str, cfg: ScalingConfig) -> torch.nn.Module:
    from ...layers.pom import PoM
    from ...layers.value_pom import ValuePoM

    torch.manual_seed(0)
    if kind == "pom":
        return PoM(cfg.dim, expand=cfg.expand, sel_heads=cfg.heads)
    return ValuePoM(cfg.dim, expand=1, value_dim=cfg.value_dim, heads=cfg.heads)


def _count_worker(rank: int, world: int, port: int, cfg: ScalingConfig, out_dir: str) -> None:
    """One forward + backward of each mixer in each mode on ``tokens_per_rank`` tokens per rank: the bytes and
    transfers of every rank, gathered to the first."""
    import torch.distributed as dist

    from ...ops.parallel import context_parallel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    n, mine = cfg.tokens_per_rank, {}
    for kind in ("pom", "value_pom"):
        layer = _scaling_layer(kind, cfg)
        for mode, kw in MODES.items():
            kw = {k: (cfg.block_size if k == "block_size" else v) for k, v in kw.items()}
            x = torch.randn(1, n, cfg.dim, requires_grad=True)
            with context_parallel(lengths=[n] * world, check="none") as cp:
                layer(x, **kw).square().mean().backward()
            mine[f"{kind} {mode}"] = (cp.bytes_sent, cp.calls)
    every: List[Any] = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        Path(out_dir, f"count{world}.json").write_text(json.dumps(every))
    dist.destroy_process_group()


def state_bytes(kind: str, cfg: ScalingConfig) -> int:
    """Bytes of one rank's carried state per sequence: PoM's (D + 1) sums and count, the value PoM's
    (heads, D/h, dv/h) state and count — fp32, whatever N."""
    if kind == "pom":
        return 4 * (cfg.expand * cfg.dim + 1)
    return 4 * (cfg.dim * cfg.value_dim // cfg.heads + 1)


def _scan_sends(P: int) -> float:
    """Sends of the state per rank, on average, of one exclusive scan over P ranks (the tree where P is a power
    of two, recursive doubling otherwise)."""
    if P & (P - 1) == 0:
        return (2 * P - 2 - math.log2(P)) / P
    return sum(P - d for d in (2 ** j for j in range(math.ceil(math.log2(P))))) / P


def transfer_model(kind: str, mode: str, P: int, cfg: ScalingConfig) -> Dict[str, float]:
    """Bytes per rank and layer call (forward + backward, mean over ranks) of this scheme and of the all-gather it
    replaced, and their time on each link of :data:`LINKS` (α-β: latency per message plus bytes over bandwidth,
    along the critical path). A MODEL; at the P counted, its bytes equal the count — block-causal's are a bound:
    its tail costs one hop at most where slices are at least a block long (tests check)."""
    S = state_bytes(kind, cfg)
    lg = math.ceil(math.log2(P))
    # the value PoM's token shift (width 2 by default): its last key / value projection to the next rank, and back
    halo = 0 if kind == "pom" else 2 * (P - 1) * 4 * (cfg.dim + cfg.value_dim) / P  # (the all-gather: 1.5 P ×)
    if mode == "full":
        sent = 2 * (2 * (P - 1) * S // P)
        rounds = lambda a, b: 2 * min(2 * (P - 1) * (a + S / P / b), 2 * lg * a + 2 * S / b)  # noqa: E731
    else:
        sent = 2 * _scan_sends(P) * S + (2 * S if mode == "block-causal" else 0)
        depth = 2 * lg - 1 if P & (P - 1) == 0 else lg
        rounds = lambda a, b: 2 * (depth + (mode == "block-causal")) * (a + S / b)  # noqa: E731
    width = 2 if mode == "block-causal" else 1
    gathered = (P - 1) * width * S + 2 * (P - 1) * width * S  # all-gather, then its backward's all-reduce of P copies
    out = {"kind": kind, "mode": mode, "P": P, "bytes": float(sent + halo),
           "allgather_bytes": float(gathered + 1.5 * P * halo)}
    for link, (a, b) in LINKS.items():
        out[f"{link} µs"] = 1e6 * rounds(a, b)
        out[f"{link} all-gather µs"] = 1e6 * ((P - 1) * (a + width * S / b) + 2 * (P - 1) * (a + width * S / b))
    return out


def scaling(cfg: ScalingConfig, progress: bool = True) -> Dict[str, Any]:
    """Count every rank's bytes at each P of ``cfg.ranks``, add the model up to ``cfg.model_ranks``, write
    parallel_scaling.json / .txt."""
    import torch.multiprocessing as mp
    from tqdm.auto import tqdm

    counted = []
    with tempfile.TemporaryDirectory() as tmp:
        for P in tqdm(cfg.ranks, desc="bench parallel --scaling (ranks)", disable=not progress):
            mp.spawn(_count_worker, args=(P, free_port(), cfg, tmp), nprocs=P, join=True)
            ranks = read_json(Path(tmp, f"count{P}.json"))  # every rank's {call: (bytes, transfers)}
            for key in ranks[0]:
                per = [r[key] for r in ranks]
                kind, mode = key.split(" ", 1)
                counted.append({"kind": kind, "mode": mode, "P": P, "mean_bytes": sum(b for b, _ in per) / P,
                                "max_bytes": float(max(b for b, _ in per)), "max_transfers": max(c for _, c in per),
                                "model_bytes": transfer_model(kind, mode, P, cfg)["bytes"]})
    model = [transfer_model(k, m, P, cfg) for k in ("pom", "value_pom") for m in MODES for P in cfg.model_ranks]
    payload = {"config": asdict(cfg), "machine": machine(), "counted": counted, "model": model}
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "parallel_scaling.json", payload)
    (out / "parallel_scaling.txt").write_text(scaling_report(payload) + "\n")
    return payload


def _growth(counted: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    by = {(r["kind"], r["mode"], r["P"]): r for r in counted}
    out = []
    for (kind, mode, P), r in sorted(by.items()):
        base = by.get((kind, mode, min(p for k, m, p in by if k == kind and m == mode)))
        out.append({**r, "vs_first": r["mean_bytes"] / base["mean_bytes"] if base and base["mean_bytes"] else None})
    return out


def scaling_report(payload: Dict[str, Any]) -> str:
    c = payload["config"]
    links = list(LINKS)
    lines = [f"BYTES PER RANK AND LAYER CALL against P, counted (forward + backward, gloo processes, batch 1, "
             f"{c['tokens_per_rank']} tokens per rank — the counts do not depend on N): d {c['dim']}, PoM D "
             f"{c['expand'] * c['dim']}, value PoM {c['heads']} heads × {c['dim'] // c['heads']} × "
             f"{c['value_dim'] // c['heads']}, block-causal blocks of {c['block_size']}",
             format_table(_growth(payload["counted"]), ["kind", "mode", "P", "mean_bytes", "max_bytes",
                                                         "max_transfers", "vs_first", "model_bytes"],
                          ["mixer", "mode", "P", "bytes / rank (mean)", "bytes (busiest rank)",
                           "transfers (busiest rank)", "mean ÷ smallest P", "model bytes"]), "",
             "MODEL, not measured: the same schemes at larger P beside the all-gather they replaced (its backward an "
             "all-reduce of P copies); time per layer call along the critical path, α-β with " +
             "; ".join(f"{k}: α {a * 1e6:g} µs, β {b / 1e9:g} GB/s" for k, (a, b) in LINKS.items()),
             format_table(payload["model"], ["kind", "mode", "P", "bytes", "allgather_bytes", f"{links[0]} µs",
                                             f"{links[0]} all-gather µs", f"{links[1]} µs",
                                             f"{links[1]} all-gather µs"],
                          ["mixer", "mode", "P", "bytes / rank", "all-gather bytes", "NVLink µs",
                           "NVLink all-gather µs", "IB µs", "IB all-gather µs"])]
    return "\n".join(lines)


# (activation checkpointing, N): the long-context LM step, with and without recomputation at one length, then 1M
MILLION = (("none", 262144), ("block", 262144), ("block", 1048576))


def million_command(ranks: int, N: int, ac: str, out: str) -> List[str]:
    """The torchrun command of one long-context step: the tiny all-PoM LM, each sequence split over ``ranks`` gloo
    processes, two steps of one sequence of N tokens."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", f"--master-port={free_port()}",
            "-m", "polymixer", "train", "lm", "--preset", "tiny-pom", "--context-parallel", str(ranks), "--block-size",
            str(N), "--activation-checkpointing", ac, "--no-pack", "--steps", "2", "--batch-size", "1", "--warmup",
            "1", "--eval-windows", "1", "--quiet", "--out", out]


def million(out: str, ranks: int = 4, progress: bool = True) -> Dict[str, Any]:
    """Train the tiny PoM LM on one sequence of each length of :data:`MILLION` split over ``ranks`` processes;
    the peak resident memory of the busiest rank (the loop's history) and the step time. Writes
    parallel_million.json / .txt."""
    import subprocess

    from tqdm.auto import tqdm

    rows = []
    for ac, N in tqdm(MILLION, desc="bench parallel --million", disable=not progress):
        with tempfile.TemporaryDirectory() as tmp:
            res = subprocess.run(million_command(ranks, N, ac, tmp), env={**os.environ, "OMP_NUM_THREADS": "1"},
                                 capture_output=True, text=True)
            if res.returncode:
                raise RuntimeError(f"bench parallel --million: N {N} with {ac} failed: {res.stderr[-2000:]}")
            rec = next(r for r in read_json(Path(tmp, "history.json")) if "loss" in r)
        rows.append({"activation_checkpointing": ac, "N": N, "P": ranks, "tokens_per_rank": N // ranks,
                     "peak_rss_mb": rec["peak_rss_mb"], "step_s": 2 * N / rec["tok_s"] if rec["tok_s"] else None,
                     "loss": rec["loss"]})
    cmd = million_command(ranks, MILLION[-1][1], "block", "OUT")
    shown = ["torchrun", f"--nproc-per-node {ranks}"] + cmd[cmd.index("-m", 3):]  # what a user types
    payload = {"config": {"ranks": ranks, "command": " ".join(shown)},
               "machine": machine(), "rows": rows}
    Path(out).mkdir(parents=True, exist_ok=True)
    write_json(Path(out, "parallel_million.json"), payload)
    Path(out, "parallel_million.txt").write_text(million_report(payload) + "\n")
    return payload


def million_report(payload: Dict[str, Any]) -> str:
    rows = payload["rows"]
    by = {(r["activation_checkpointing"], r["N"]): r for r in rows}
    lines = [f"LONG CONTEXT ON THIS MACHINE, measured: the tiny all-PoM LM (4 blocks × 128), one sequence split over "
             f"{payload['config']['ranks']} gloo processes (one thread each, sharing {payload['machine'].get('cores')} "
             f"cores), two training steps; peak resident memory of the busiest rank (host RSS, everything included)",
             format_table(rows, ["activation_checkpointing", "N", "P", "tokens_per_rank", "peak_rss_mb", "step_s",
                                 "loss"],
                          ["activation checkpointing", "N", "P", "tokens / rank", "peak MB (busiest rank)",
                           "s / step", "loss"])]
    for (ac, N), r in sorted(by.items()):
        base = by.get(("none", N))
        if ac != "none" and base:
            v = r["peak_rss_mb"] / base["peak_rss_mb"]
            lines.append(f"{ac} checkpointing at N {N:,}: peak memory per rank {v:.2f}× without (target ≤ 0.5: "
                         f"{'met' if v <= 0.5 else 'MISSED'})")
    lines.append("command: " + payload["config"]["command"])
    return "\n".join(lines)


def nvlink_model(cfg: ParallelBenchConfig) -> List[Dict[str, Any]]:
    """Per layer and rank on ``model_gpus`` H100 over NVLink (MODEL): the causal PoM's bytes of its rank scan
    (:func:`transfer_model`, the mean over ranks: the count at the P run here; its sums stay fp32 in bf16 training)
    and its time along the scan's critical path (α-β, :data:`LINKS`); ring attention's keys and values in bf16, sent
    P − 1 times forward and, with their gradients, twice as much backward, at 450 GB/s per direction; beside PoM's
    GEMM time (fwd + bwd of W_in and W_o at 70% of 989 TFLOP/s)."""
    P = cfg.model_gpus
    nvlink, peak, eff = LINKS["NVLink (≤ 8 GPUs, one node)"][1], 989e12, 0.70
    D = cfg.expand * cfg.dim
    scan = transfer_model("pom", "causal", P, ScalingConfig(dim=cfg.dim, expand=cfg.expand, heads=cfg.heads,
                                                            value_dim=cfg.value_dim))
    out = []
    for N in cfg.model_lengths:
        n = N // P
        gemm = 3 * 2 * n * cfg.dim * (2 * D + D) / (peak * eff)
        ring = 3 * (P - 1) * n * 2 * cfg.dim * 2
        out.append({"N": N, "P": P, "pom_bytes": scan["bytes"], "ring_bytes": ring,
                    "pom_us": scan["NVLink (≤ 8 GPUs, one node) µs"], "ring_us": 1e6 * ring / nvlink,
                    "gemm_us": 1e6 * gemm, "ratio": ring / scan["bytes"]})
    return out


def run(cfg: ParallelBenchConfig, progress: bool = True) -> Dict[str, Any]:
    import torch.multiprocessing as mp
    from tqdm.auto import tqdm

    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for P in tqdm(cfg.ranks, desc="bench parallel (ranks)", disable=not progress):
            mp.spawn(_worker, args=(P, free_port(), cfg, _plan(cfg, P), tmp), nprocs=P, join=True)
            rows += read_json(Path(tmp, f"ranks{P}.json"))
    single = {(r["mixer"], r["N"]): r for r in rows if r["P"] == 1}
    for r in rows:
        base = single.get((r["mixer"], r["N"]))
        r["memory_vs_one"] = (r["peak_mb"] / base["peak_mb"]) if base and r["peak_mb"] and base["peak_mb"] else None
    fits = []
    for kind in MIXERS:
        for P in cfg.ranks:
            run_ = [r for r in rows if r["mixer"] == kind and r["P"] == P and r["peak_mb"]]
            if not run_:
                continue
            last = max(run_, key=lambda r: r["N"])
            scale = cfg.budget_gb * 1024 / last["peak_mb"]
            N_max = last["N"] * (scale if kind != "attention" else math.sqrt(scale))
            fits.append({"mixer": kind, "P": P, "from_N": last["N"], "peak_mb": last["peak_mb"],
                         "longest_N": int(N_max)})
    payload = {"config": asdict(cfg), "machine": machine(), "rows": rows, "fits": fits,
               "model": nvlink_model(cfg)}
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "parallel.json", payload)
    plot(payload, out / "parallel.png")
    (out / "parallel.txt").write_text(report(payload) + "\n")
    return payload


def _ratio_line(rows: List[Dict[str, Any]]) -> str:
    by = {(r["mixer"], r["N"], r["P"]): r for r in rows}
    parts = []
    for (kind, N, P), r in sorted(by.items()):
        if kind != "attention" or P == 1:
            continue
        pom = by.get(("pom", N, P))
        if pom and pom["bytes_per_rank"]:
            parts.append(f"N {N:,}, P {P}: {r['bytes_per_rank'] / pom['bytes_per_rank']:,.0f}×")
    return "attention ÷ PoM bytes per rank and layer: " + "; ".join(parts)


def report(payload: Dict[str, Any]) -> str:
    c = payload["config"]
    m = payload["machine"]
    rows = payload["rows"]
    lines = [f"CONTEXT PARALLELISM, measured: gloo CPU processes on one machine ({m.get('cpu', '?')}, "
             f"{m.get('cores', '?')} cores; P processes share them, one thread each — step times are not those of "
             f"P devices), causal layer forward + backward, batch 1, d {c['dim']}, PoM D {c['expand'] * c['dim']} "
             f"(a gate per head of {c['heads']}), value PoM dv {c['value_dim']} × {c['heads']} heads, attention "
             f"{c['heads']} heads",
             format_table(rows, ["mixer", "N", "P", "n_per_rank", "bytes_per_rank", "step_s", "peak_mb",
                                 "memory_vs_one", "exchange_only"],
                          ["mixer", "N", "P", "tokens / rank", "bytes sent / rank (mean)", "step s (median)",
                           "peak MB / rank", "memory ÷ one process", "exchange only"]),
             "", _ratio_line(rows), ""]
    pom64 = [r for r in rows if r["mixer"] == "pom" and r["N"] == 65536 and r["P"] == 2]
    if pom64 and pom64[0]["memory_vs_one"]:
        v = pom64[0]["memory_vs_one"]
        lines.append(f"PoM at N 65,536, P 2: peak memory per rank {v:.2f}× one process (target ≤ 0.55: "
                     f"{'met' if v <= 0.55 else 'MISSED'})")
    lines += [f"longest N within {c['budget_gb']:g} GB per rank (extrapolated from the longest N run: linear for the "
              "PoMs, quadratic for attention's scores)",
              format_table(payload["fits"], ["mixer", "P", "from_N", "peak_mb", "longest_N"],
                           ["mixer", "P", "from N", "peak MB", "longest N"]), "",
              f"MODEL, not measured: {c['model_gpus']} × H100 over NVLink (450 GB/s per direction; PoM's scan: 3 µs a "
              "transfer along its critical path), bf16, per layer and rank, forward + backward",
              format_table(payload["model"], ["N", "P", "pom_bytes", "ring_bytes", "ratio", "pom_us", "ring_us",
                                               "gemm_us"],
                           ["N", "GPUs", "PoM bytes", "ring attention bytes", "ring ÷ PoM", "PoM µs", "ring µs",
                            "PoM's GEMMs µs"])]
    return "\n".join(lines)


def plot(payload: Dict[str, Any], path: Path) -> None:
    rows = payload["rows"]
    fig, axes = new_figure(2, width=4.6, height=3.6)
    for kind, color in zip(MIXERS, ("C1", "C2", "C0")):
        for P, style in zip(sorted({r["P"] for r in rows if r["P"] > 1}), ("o-", "s--", "^:")):
            pts = sorted((r["N"], r["bytes_per_rank"]) for r in rows if r["mixer"] == kind and r["P"] == P)
            if pts:
                axes[0].plot(*zip(*pts), style, color=color, label=f"{kind}, P {P}")
        for P, style in zip(sorted({r["P"] for r in rows}), ("o-", "s--", "^:")):
            pts = sorted((r["N"], r["peak_mb"]) for r in rows if r["mixer"] == kind and r["P"] == P and r["peak_mb"])
            if pts:
                axes[1].plot(*zip(*pts), style, color=color, label=f"{kind}, P {P}")
    for ax, label in zip(axes, ("bytes sent per rank and layer", "peak tensor MB per rank")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per sequence N")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle("context parallelism, causal layer fwd + bwd (gloo CPU processes; measured)", fontsize=9)
    save_figure(fig, path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ParallelBenchConfig()
    p.add_argument("--lengths", type=int_at_least(1), nargs="+", default=list(d.lengths), help="sequence lengths N")
    p.add_argument("--ranks", type=int_at_least(1), nargs="+", default=list(d.ranks), help="process counts P")
    p.add_argument("--attention-max", type=int_at_least(0), default=d.attention_max,
                   help="longest N attention runs whole (longer: its exchange alone is counted)")
    p.add_argument("--repeats", type=int_at_least(1), default=d.repeats)
    p.add_argument("--budget-gb", type=float_in(Range(0, low_open=True)), default=d.budget_gb,
                   help="memory per rank for the longest-N column")
    p.add_argument("--quick", action="store_true", help="N 4,096 and 16,384 on 1 and 2 processes")
    p.add_argument("--million", action="store_true",
                   help="train the tiny PoM LM on 262,144 and 1,048,576-token sequences over 4 processes, with and "
                        "without activation checkpointing: peak memory per rank (about 12 minutes)")
    p.add_argument("--scaling", action="store_true",
                   help="only count the bytes per rank against P (2, 4, 8 processes) and model larger P (seconds)")
    p.add_argument("--out", default=d.out)


def main(args: argparse.Namespace) -> int:
    if args.million:
        print(million_report(million(args.out)))
        return 0
    if args.scaling:
        payload = scaling(ScalingConfig(out=args.out))
        print(scaling_report(payload))
        print(f"\nwrote {Path(args.out) / 'parallel_scaling.json'}, {Path(args.out) / 'parallel_scaling.txt'}")
        return 0
    cfg = ParallelBenchConfig(lengths=tuple(args.lengths), ranks=tuple(args.ranks), attention_max=args.attention_max,
                              repeats=args.repeats, budget_gb=args.budget_gb, out=args.out)
    if args.quick:
        cfg.lengths, cfg.ranks = (4096, 16384), (1, 2)
    payload = run(cfg)
    print(report(payload))
    out = Path(cfg.out)
    print(f"\nwrote {out / 'parallel.json'}, {out / 'parallel.txt'}, {out / 'parallel.png'}")
    return 0
