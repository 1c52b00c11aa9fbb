"""HBM traffic of the kernels, counted in Triton's interpreter: ``polymixer kernels --traffic``.

Every load and store the interpreter executes is recorded (its addresses, where the mask lets it through); at the
end of each launch the addresses are attributed to the launch's tensor arguments and each tensor's distinct bytes
are counted — what the kernel reads from and writes to global memory when every element it touches crosses HBM once
(repeats within a launch hit the caches). Summed over a call's launches and divided by N·D elements of the
activations' size, the per-token tensors give the HBM passes of docs/gpu.md, against the floor (forward: read z_h,
z_s, write g = 3; backward: read z_h, z_s, dg, write dz_h, dz_s = 5); tables of O(N·D / chunk) (carries, end sums,
partial gradients) are counted apart. A count, not a timing: it holds on any machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

__all__ = ["Case", "CASES", "count", "counted_bytes", "measure", "table", "main"]



@dataclass(frozen=True)
class Case:
    """One row of the table: a mode, a route and a gate head."""

    mode: str  # causal, full, block-causal, packed causal, packed full
    route: str = "triton"  # or triton_gemm
    G: int = 1


CASES = [Case(m, r) for r in ("triton", "triton_gemm")
         for m in ("causal", "full", "block-causal", "packed causal", "packed full")] + [
    Case("causal", "triton", 16), Case("full", "triton", 16), Case("causal", "triton_gemm", 16)]


class _Recorder:
    """Installs itself around the interpreter's launches, loads and stores."""

    def __init__(self) -> None:
        self.launches: List[Dict[str, Any]] = []
        self._current: Optional[Dict[str, Any]] = None

    @contextlib.contextmanager
    def installed(self) -> Iterator["_Recorder"]:
        import numpy as np
        from triton.runtime import interpreter as ti

        rec = self
        orig_call = ti.GridExecutor.__call__
        orig_load = ti.InterpreterBuilder.create_masked_load
        orig_store = ti.InterpreterBuilder.create_masked_store

        def call(self_: Any, *args: Any, **kwargs: Any) -> Any:
            import torch

            tensors = [(n, a) for n, a in zip(self_.arg_names, args) if isinstance(a, torch.Tensor)]
            tensors += [(n, a) for n, a in kwargs.items() if isinstance(a, torch.Tensor)]
            rec._current = {"kernel": self_.fn.__name__, "tensors": tensors, "reads": [], "writes": []}
            try:
                return orig_call(self_, *args, **kwargs)
            finally:
                rec.launches.append(rec._finish(rec._current))
                rec._current = None

        def load(self_: Any, ptrs: Any, mask: Any, other: Any, cache_policy: Any, is_volatile: Any) -> Any:
            if rec._current is not None:
                rec._current["reads"].append(np.asarray(ptrs.data)[np.asarray(mask.data, dtype=bool)].ravel())
            return orig_load(self_, ptrs, mask, other, cache_policy, is_volatile)

        def store(self_: Any, ptrs: Any, value: Any, mask: Any, cache_policy: Any) -> Any:
            if rec._current is not None:
                rec._current["writes"].append(np.asarray(ptrs.data)[np.asarray(mask.data, dtype=bool)].ravel())
            return orig_store(self_, ptrs, value, mask, cache_policy)

        ti.GridExecutor.__call__ = call
        ti.InterpreterBuilder.create_masked_load = load
        ti.InterpreterBuilder.create_masked_store = store
        try:
            yield self
        finally:
            ti.GridExecutor.__call__ = orig_call
            ti.InterpreterBuilder.create_masked_load = orig_load
            ti.InterpreterBuilder.create_masked_store = orig_store

    @staticmethod
    def _finish(launch: Dict[str, Any]) -> Dict[str, Any]:
        """Distinct bytes read from and written to each tensor argument of one launch."""
        import numpy as np

        out: Dict[str, Any] = {"kernel": launch["kernel"], "tensors": {}}
        spans = {}
        for name, t in launch["tensors"]:
            base = t.untyped_storage().data_ptr()
            spans.setdefault((base, t.untyped_storage().nbytes()), []).append((name, t))
        for kind in ("reads", "writes"):
            addrs = np.unique(np.concatenate(launch[kind])) if launch[kind] else np.zeros(0, dtype=np.uint64)
            for (base, nbytes), named in spans.items():
                inside = addrs[(addrs >= base) & (addrs < base + nbytes)]
                if not inside.size:
                    continue
                name, t = named[0]
                entry = out["tensors"].setdefault(name, {"shape": tuple(t.shape), "itemsize": t.element_size(),
                                                         "reads": 0, "writes": 0})
                entry[kind] += int(inside.size) * t.element_size()
        return out


def _inputs(case: Case, B: int, N: int, d: int, D: int, device: Any) -> Tuple[List[Any], Any, Dict[str, Any]]:
    """(PoM's weights [W_in, b, α, W_o] with gradients, x, the call's keywords) of one row of the table."""
    import torch

    Ds = D // case.G
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(D + Ds, d, generator=gen) / d ** 0.5, torch.randn(Ds, generator=gen),
               torch.rand(D, 2, generator=gen) * 2 - 1, torch.randn(d, D, generator=gen) / D ** 0.5]
    weights = [w.to(device).requires_grad_() for w in weights]
    kw: Dict[str, Any] = {}
    rows = B
    if case.mode.startswith("packed"):
        rows = 1
        kw["cu_seqlens"] = torch.tensor([0, N // 3, N // 3 + 1, 2 * N], dtype=torch.int32, device=device)
    if case.mode.endswith("causal"):
        kw["causal"] = True
    if case.mode == "block-causal":
        kw["block_size"] = 16
    n = 2 * N if rows == 1 else N
    return weights, torch.randn(rows, n, d, generator=gen).to(device), kw


def count(case: Case, B: int = 2, N: int = 256, d: int = 32, D: int = 64) -> Dict[str, Any]:
    """Counted traffic of one PoM call (forward, then backward) on the kernels: passes per N·D element of the
    per-token tensors and of the tables, and each kernel's bytes. Needs ``TRITON_INTERPRET=1``."""
    import torch

    from ...ops import backend
    from ...ops.pom import PomWeights, pom
    from ...ops.pom import triton_kernels as tk

    cpu = torch.device("cpu")
    tk.use_config(tk.LaunchConfig(None, 16, 4, 32))  # the dispatcher's own tiles
    try:
        weights, x, kw = _inputs(case, B, N, d, D, cpu)
        x.requires_grad_(True)
        tokens = x.shape[0] * x.shape[1]
        result: Dict[str, Any] = {"case": case.__dict__, "tokens": tokens, "D": D, "d": d}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fwd = _Recorder()
            with fwd.installed(), backend(case.route):
                y = pom(x, PomWeights(*weights), **kw)
            bwd = _Recorder()
            with bwd.installed():
                y.float().square().sum().backward()
        for part, rec in (("forward", fwd), ("backward", bwd)):
            per_token = tables = 0
            kernels: Dict[str, int] = {}
            for launch in rec.launches:
                for name, t in launch["tensors"].items():
                    nbytes = t["reads"] + t["writes"]
                    kernels[launch["kernel"]] = kernels.get(launch["kernel"], 0) + nbytes
                    if _per_token(t["shape"], tokens):
                        per_token += nbytes
                    else:
                        tables += nbytes
            unit = tokens * D * 2  # one pass: N·D bf16 elements
            result[part] = {"passes": per_token / unit, "table_passes": tables / unit, "launches": len(rec.launches),
                            "kernels": {k: v / unit for k, v in kernels.items()}}
        return result
    finally:
        tk.use_config(None)


def counted_bytes(fn: Callable[[], None]) -> int:
    """The distinct bytes every launch of ``fn()`` reads and writes, summed over its launches (in Triton's
    interpreter): what ``scripts/gpu-check`` divides by a kernel's time is checked against this."""
    rec = _Recorder()
    with rec.installed():
        fn()
    return sum(t["reads"] + t["writes"] for launch in rec.launches for t in launch["tensors"].values())


def _per_token(shape: Tuple[int, ...], tokens: int) -> bool:
    """A tensor of a value per token and channel — x, z, g and their gradients: (B, N, C) or (T, C) with C ≥ 8 (not
    weights, masks, positions, or tables of O(N / chunk) rows)."""
    if len(shape) == 3:
        return shape[0] * shape[1] == tokens and shape[2] >= 8
    return len(shape) == 2 and shape[0] == tokens and shape[1] >= 8


def measure(cases: List[Case], progress: bool = True) -> List[Dict[str, Any]]:
    from tqdm.auto import tqdm

    return [count(c) for c in tqdm(cases, desc="traffic", disable=not progress, dynamic_ncols=True)]


def table(rows: List[Dict[str, Any]]) -> str:
    """The guide's table: counted passes against the model and the floor."""
    from ..report import format_table
    from ...ops.pom.cost import PASS_FLOOR, hbm_passes

    out = []
    for r in rows:
        c = r["case"]
        mode = "causal" if c["mode"].endswith("causal") and c["mode"] != "block-causal" else "end"
        model = hbm_passes(mode, fused=c["route"] == "triton_gemm", G=c["G"], d_over_D=r["d"] / r["D"])
        out.append({"mode": c["mode"], "route": c["route"], "gate": "per channel" if c["G"] == 1 else f"per {c['G']}",
                    "fwd": round(r["forward"]["passes"], 2),
                    "fwd_model": round(model["forward"], 2), "bwd": round(r["backward"]["passes"], 2),
                    "bwd_model": round(model["backward"], 2),
                    "tables": round(r["forward"]["table_passes"] + r["backward"]["table_passes"], 3),
                    "launches": f"{r['forward']['launches']} + {r['backward']['launches']}"})
    return (format_table(out, ["mode", "route", "gate", "fwd", "fwd_model", "bwd", "bwd_model", "tables",
                               "launches"],
                         ["mode", "route", "gate", "forward (counted)", "forward (model)",
                          "backward (counted)", "backward (model)", "tables (fwd + bwd)", "kernel launches"])
            + f"\n\nfloor: forward {PASS_FLOOR['forward']:g}, backward {PASS_FLOOR['backward']:g} passes per N·D "
              "element (read z_h, z_s, dg; write g, dz_h, dz_s); the fused route reads x (d / D = 0.5 of a pass) "
              "instead of z")


def main(args: argparse.Namespace) -> int:
    """``polymixer kernels --traffic [--json PATH]``: the counted table (in a process with the interpreter on)."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        cmd = [sys.executable, "-m", "polymixer", "kernels", "--traffic"]
        if args.json:
            cmd += ["--json", args.json]
        if args.quiet:
            cmd.append("--quiet")
        return subprocess.run(cmd, env={**os.environ, "TRITON_INTERPRET": "1"}).returncode
    rows = measure(CASES, progress=not args.quiet)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0
