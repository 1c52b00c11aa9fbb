"""``python -m polymixer.experiments.bench.dispatch_table --from OUT/mixer.json --out PATH``: the dispatcher's
measured table from
a GPU run of ``polymixer bench mixer --device cuda``.

Each row pair of the bench — a Triton route and the torch form of the same op and mode at the same N and batch, in
the forward (``fwd_ms``, under ``no_grad``) and in forward + backward (``fwdbwd_ms``) — becomes an entry of
:mod:`polymixer.ops.measured`: the medians, their ratio, and whether the route was faster than the torch form and
than the routes the automatic choice would try after it (``triton_gemm`` against ``triton``), by at least the
margin (5% by default: a tie is not a reason to take a kernel). The run also records the bandwidth its PoM mixing
kernels and its torch form reached (their elementwise time — the row's time less its matrix-product floor — over
their counted passes, :mod:`polymixer.ops.pom.cost`), and the fraction of the tensor-core peak of the fused route,
from which the cost model predicts calls the table has no entry for.

The card's architecture and name and the hashes of the kernel source the run measured come from the bench's machine
record (``machine["capability"]``, ``machine["gpu"]``, ``machine["kernels"]``) where it has them; else from
``--arch``, ``--gpu`` and ``--kernel-hash OP=HEX`` — the hashes default to the kernel source installed here (build the
table on the checkout that ran the bench). ``--into TABLE`` adds the run to an existing table (replacing a run of the
same source, architecture and date).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ...ops import measured
from ...ops.pom import cost
from .roofline import GPU, GPUS, gpu_of
from ...ops.dispatch import AUTO_ORDER
from ...ranges import Range
from ..tasks.common import float_in

__all__ = ["MARGIN", "parse_mixer", "build_run", "build_table", "add_run", "dumps", "main"]

MARGIN = 0.95  # a route is "faster" at ≤ 95% of the torch form's (and its later rivals') median time
_ROW = re.compile(r"^(pom|value pom(?: att-sized)?) (full|causal|block-causal)(?: (triton|triton_gemm))?$")
_PASSES = (("forward", "fwd_ms"), ("forward+backward", "fwdbwd_ms"))


def parse_mixer(name: str) -> Optional[Tuple[str, str, str, str]]:
    """(op, mode, backend, variant) of a bench row name — "pom causal triton" → ("pom", "causal", "triton", ""),
    "value pom att-sized full" → ("value_pom", "full", "torch", "att-sized") — or None for rows that are neither
    (floors, compiled modules, SDPA)."""
    m = _ROW.match(name)
    if m is None:
        return None
    layer = m.group(1)
    variant = "att-sized" if layer.endswith(" att-sized") else ""
    return ("pom" if layer == "pom" else "value_pom"), m.group(2), m.group(3) or "torch", variant


def _dtype(bench: Dict[str, Any]) -> str:
    dtype = bench.get("config", {}).get("dtype", "auto")
    if dtype == "auto":  # bench mixer: fp32 on the CPU, bf16 on a GPU
        return "bf16" if str(bench.get("config", {}).get("device", "cuda")).startswith("cuda") else "fp32"
    return dtype


def _entries(rows: List[Dict[str, Any]], dtype: str, margin: float) -> List[Dict[str, Any]]:
    """One entry per (Triton route row, pass) that has the torch form's row beside it (a variant of the op's layer,
    e.g. the value PoM at attention's size, beside its own torch form)."""
    times: Dict[Tuple[int, int, str, str, str, str], Dict[str, float]] = {}
    for r in rows:
        parsed = parse_mixer(r["mixer"])
        if parsed is None:
            continue
        op, mode, backend, variant = parsed
        for pass_, key in _PASSES:
            if r.get(key) is not None:
                times.setdefault((r["N"], r["batch"], op, variant, mode, pass_), {})[backend] = float(r[key])
    out = []
    for (N, batch, op, variant, mode, pass_), by_backend in sorted(times.items()):
        if "torch" not in by_backend:
            continue
        for backend, ms in by_backend.items():
            if backend == "torch":
                continue
            later = AUTO_ORDER[AUTO_ORDER.index(backend) + 1:]
            rivals = {b: t for b, t in by_backend.items() if b in later and b != "torch"}
            best_other = min([by_backend["torch"], *rivals.values()])
            out.append({"op": op, **({"variant": variant} if variant else {}), "backend": backend, "mode": mode,
                        "pass": pass_, "dtype": dtype,
                        "length": measured.size_bucket(N), "tokens": measured.size_bucket(N * batch), "N": N,
                        "batch": batch, "ms": round(ms, 4), "torch_ms": round(by_backend["torch"], 4),
                        "rivals": {b: round(t, 4) for b, t in rivals.items()},
                        "ratio": round(ms / by_backend["torch"], 4), "faster": ms <= margin * best_other})
    return out


def _sig(x: float) -> float:
    """``x`` to 4 significant digits (what a median of a few repeats supports)."""
    return float(f"{x:.4g}")


def _pom_efficiency(bench: Dict[str, Any], spec: Optional[GPU]) -> Dict[str, Dict[str, Any]]:
    """The bandwidth PoM's mixing kernels and torch form reached, per pass: the slowest kernels, the fastest torch
    form over the run's rows (bytes/s, and fractions of the card's datasheet bandwidth where it is known), and the
    fused route's fraction of the peak (forward)."""
    cfg = bench.get("config", {})
    d = int(cfg.get("dim", 0))
    D = int(round(d * float(cfg.get("expand", 2))))
    sel = int(cfg.get("sel_heads", 1) or 1)
    Ds = D if sel == 1 else sel
    G = max(1, D // Ds)
    k = int(cfg.get("degree", 2))
    e = 2 if _dtype(bench) in ("bf16", "fp16") else 4
    rows: Dict[Tuple[int, int, str], Dict[str, Any]] = {}
    for r in bench.get("rows", ()):
        rows[(r["N"], r["batch"], r["mixer"])] = r
    out: Dict[str, Dict[str, Any]] = {}
    for pass_, key in _PASSES:
        train = pass_ == "forward+backward"
        kernels: List[float] = []
        torch_form: List[float] = []
        fused: List[float] = []
        for (N, batch, name), r in rows.items():
            parsed = parse_mixer(name)
            floor = rows.get((N, batch, "pom matmuls (floor)"), {}).get(key)
            if parsed is None or parsed[0] != "pom" or r.get(key) is None or floor is None:
                continue
            _, mode, backend, _ = parsed
            T = N * batch
            spent = (r[key] - floor) * 1e-3  # the elementwise time: the row less its matrix products
            if backend == "triton" and spent > 0:
                p = cost.hbm_passes("causal" if mode == "causal" else "end", G=G)
                kernels.append(T * D * e * (p["forward"] + (p["backward"] if train else 0.0)) / spent)
            elif backend == "torch" and spent > 0:
                torch_form.append(T * D * e * cost.torch_form_passes(mode, e, train) / spent)
            elif backend == "triton_gemm" and not train and spent > 0:
                w_in, w_out = d * (D + Ds), D * d
                kernel_s = (r[key] - floor * w_out / (w_in + w_out)) * 1e-3  # W_o stays a cuBLAS product
                fused.append((2.0 * T * w_in + T * D * (2 * k + 12)) / kernel_s)
        if not kernels or not torch_form:
            continue
        eff: Dict[str, Any] = {"kernels_bytes_per_s": _sig(min(kernels)), "torch_bytes_per_s": _sig(max(torch_form))}
        if spec is not None:
            eff["kernels_fraction"] = _sig(min(kernels) / spec.bandwidth)
            eff["torch_fraction"] = _sig(max(torch_form) / spec.bandwidth)
            if fused:
                eff["fused_flops_fraction"] = _sig(min(fused) / spec.peak)
        # the passes the bandwidths were reckoned with (the kernels' as counted for the kernel code of this build)
        eff["kernel_passes"] = {m: cost.hbm_passes(m, G=G) for m in ("causal", "end")}
        out[pass_] = eff
    return out


def build_run(bench: Dict[str, Any], *, arch: Optional[str] = None, gpu: Optional[str] = None,
              kernels: Optional[Dict[str, str]] = None, source: str = "", margin: float = MARGIN,
              note: Optional[str] = None) -> Dict[str, Any]:
    """One run of the table from a ``bench mixer`` payload. ``arch`` / ``gpu`` / ``kernels`` stand in for what the
    payload's machine record lacks (ValueError naming what is missing)."""
    machine = bench.get("machine", {})
    arch = machine.get("capability") or arch
    gpu = machine.get("gpu") or gpu
    hashes = dict(machine.get("kernels") or {})
    for op, h in (kernels or {}).items():
        hashes.setdefault(op, h)
    if not arch:
        raise ValueError("the bench JSON records no compute capability (machine['capability']): pass --arch, e.g. "
                         "sm_90")
    if not re.fullmatch(r"sm_\d+", arch):
        raise ValueError(f"--arch must look like sm_90, got {arch!r}")
    rows = bench.get("rows")
    if not isinstance(rows, list):
        raise ValueError("not a bench mixer JSON: it has no list of rows")
    key = gpu_of(gpu or "")
    spec = GPUS[key] if key else None
    cfg = bench.get("config", {})
    run: Dict[str, Any] = {
        "source": source, "arch": arch, "gpu": gpu or "?", "date": machine.get("date"), "torch": machine.get("torch"),
        "kernels": {op: hashes.get(op) for op in ("pom", "value_pom")},
        "shape": {"dim": cfg.get("dim"), "poly_dim": None if cfg.get("dim") is None else
                  int(round(cfg["dim"] * float(cfg.get("expand", 2)))), "degree": cfg.get("degree"),
                  "sel_heads": cfg.get("sel_heads", 1), "value_dim": cfg.get("value_dim"),
                  "value_heads": cfg.get("value_heads"), "dtype": _dtype(bench), "compile": cfg.get("compile")},
        "entries": _entries(rows, _dtype(bench), margin),
        "efficiency": {"pom": _pom_efficiency(bench, spec)},
    }
    if spec is not None:
        run["spec"] = {"bandwidth": spec.bandwidth, "peak": spec.peak}
    if note:
        run["note"] = note
    return run


def build_table(runs: Iterable[Dict[str, Any]], margin: float = MARGIN) -> Dict[str, Any]:
    """A table (:data:`polymixer.ops.measured.FORMAT`) of ``runs``."""
    return {"format": measured.FORMAT, "margin": margin,
            "about": "built by python -m polymixer.experiments.bench.dispatch_table from polymixer bench mixer "
                     "--device cuda; "
                     "an entry applies only to the kernel source whose hash its run records",
            "runs": list(runs)}


def add_run(table: Dict[str, Any], run: Dict[str, Any]) -> Dict[str, Any]:
    """``table`` with ``run`` added, replacing a run of the same source, architecture and date."""
    same = (run.get("source"), run.get("arch"), run.get("date"))
    kept = [r for r in table.get("runs", []) if (r.get("source"), r.get("arch"), r.get("date")) != same]
    return dict(table, runs=kept + [run])


def dumps(table: Dict[str, Any]) -> str:
    """The table as JSON with one line per entry (readable in a diff)."""
    line = lambda obj: json.dumps(obj, ensure_ascii=False)  # noqa: E731
    runs = []
    for run in table.get("runs", []):
        fields = [f"   {line(k)}: {line(v)}" for k, v in run.items() if k != "entries"]
        entries = ",\n".join(f"    {line(e)}" for e in run.get("entries", []))
        fields.append(f'   "entries": [\n{entries}\n   ]')
        runs.append("  {\n" + ",\n".join(fields) + "\n  }")
    head = [f" {line(k)}: {line(v)}" for k, v in table.items() if k != "runs"]
    return "{\n" + ",\n".join(head + [' "runs": [\n' + ",\n".join(runs) + "\n ]"]) + "\n}\n"


def _hashes(pairs: Sequence[str]) -> Dict[str, str]:
    out = {}
    for pair in pairs:
        op, sep, h = pair.partition("=")
        if not sep or op not in measured.KERNEL_FILES or not re.fullmatch(r"[0-9a-f]{12}", h):
            raise ValueError(f"--kernel-hash takes OP=HEX with OP pom or value_pom and 12 hex digits, got {pair!r}")
        out[op] = h
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m polymixer.experiments.bench.dispatch_table",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="source", required=True, help="the mixer.json of bench mixer --device cuda")
    p.add_argument("--out", required=True, help="where to write the table (polymixer/ops/measured.json ships it)")
    p.add_argument("--into", help="an existing table to add this run to (default: a table of this run alone)")
    p.add_argument("--arch", help="the card's architecture, e.g. sm_90, where the bench JSON does not record it")
    p.add_argument("--gpu", help="the card's name, e.g. 'NVIDIA H200', where the bench JSON does not record it")
    p.add_argument("--kernel-hash", nargs="*", default=[], metavar="OP=HEX",
                   help="the hash of the kernel source the run measured, per op, where the bench JSON does not record "
                        "it (default: the kernel source installed here)")
    p.add_argument("--label", help="the run's source as written in the table (default: the --from path)")
    p.add_argument("--margin", type=float_in(Range(0, 1, low_open=True)), default=MARGIN,
                   help="faster means at most this fraction of the time")
    p.add_argument("--note", help="a line of provenance kept with the run")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        bench = json.loads(Path(args.source).read_text())
        given = _hashes(args.kernel_hash)
        recorded = (bench.get("machine") or {}).get("kernels") or {}
        defaulted = [op for op in measured.KERNEL_FILES if op not in given and op not in recorded]
        for op in defaulted:
            given[op] = measured.kernel_hash(op)
        run = build_run(bench, arch=args.arch, gpu=args.gpu, kernels=given, source=args.label or args.source,
                        margin=args.margin, note=args.note)
        base = measured.load(args.into) if args.into else build_table([], args.margin)
    except (OSError, ValueError) as e:
        print(f"dispatch_table: {e}", file=sys.stderr)
        return 2
    if defaulted:
        print(f"dispatch_table: the bench JSON records no kernel hash for {', '.join(defaulted)}: took the source "
              f"installed here ({', '.join(f'{op}={given[op]}' for op in defaulted)})", file=sys.stderr)
    table = add_run(base, run)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(dumps(table))
    taken = sum(e["faster"] for e in run["entries"])
    print(f"wrote {args.out}: {len(run['entries'])} entries on {run['arch']} ({run['gpu']}), {taken} faster than "
          f"the torch form")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
