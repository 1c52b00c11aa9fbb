"""Ahead-of-time builds of the Triton kernels for NVIDIA GPUs, without a GPU: ``polymixer kernels``.

``triton.compile`` lowers each kernel to PTX for a target (``GPUTarget("cuda", 90, 32)`` for sm_90), and the
``ptxas`` the Triton wheel ships assembles it with ``-v``: registers per thread, spill stores and loads, shared
memory. A compile error, a kernel over the target's shared memory or one that spills shows here on a CPU-only
machine, before anyone runs it on a GPU. Every kernel is built at every launch configuration the dispatcher can pick
(:func:`polymixer.ops.pom.triton_kernels.launch_configs`), for the mode flags that change its code.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

__all__ = ["Build", "builds", "build", "build_all", "summarise", "SHARED_LIMIT", "add_arguments", "main"]

# the most shared memory one block may use (bytes): sm_80 (A100) 163 KB, sm_90 (H100) 227 KB
SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}


@dataclass(frozen=True)
class Build:
    """One kernel specialisation to build: the kernel's name, its constexprs and the element types of its tensors."""

    op: str
    kernel: str
    constexprs: Tuple[Tuple[str, Any], ...]
    dtype: str = "bf16"  # the activations' element type (z, g and their gradients); parameters stay fp32
    num_warps: int = 4

    @property
    def config(self) -> str:
        c = dict(self.constexprs)
        keys = ("BLOCK_N", "BLOCK_D", "GBLOCK", "CHUNK", "BLOCK_K", "BLOCK_V")
        tiles = "×".join(str(c[k]) for k in keys if k in c)
        flags = ",".join(f"{k}={v}" for k, v in self.constexprs if k not in keys)
        return f"{tiles} w{self.num_warps} {self.dtype} [{flags}]"


# pointer arguments whose element type follows the activations; the others are fp32 (parameters, sums) or int32
_ACT_POINTERS = {"z_ptr", "g_ptr", "dz_ptr", "dg_ptr", "x_ptr", "q_ptr", "k_ptr", "v_ptr", "o_ptr", "do_ptr",
                 "dq_ptr", "dk_ptr", "dv_ptr"}
_INT_POINTERS = {"start_ptr", "isend_ptr", "endid_ptr", "seg_ptr", "first_ptr"}


def _signature(fn: Any, b: Build) -> Dict[str, str]:
    consts = {k: v for k, v in b.constexprs if k in fn.arg_names}
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*" + ({"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}[b.dtype] if name in _ACT_POINTERS
                               else "i32" if name in _INT_POINTERS else "fp32")
        else:
            sig[name] = "i32"
    return sig


def _kernel(op: str, name: str) -> Any:
    if op == "pom":
        from .pom import triton_kernels as tk
    else:
        from .value_pom import triton_kernels as tk  # type: ignore[no-redef]
    return tk.KERNELS[name]


def builds(representative: bool = False) -> List[Build]:
    """Every (kernel, launch configuration, mode) the dispatcher can launch; ``representative``: one per kernel, at
    the default configuration (:func:`~polymixer.ops.pom.triton_kernels.default_launch_config`, no rotary) for PoM
    and the tiles of a 64 × 64 head for the value PoM (the builds come in that order)."""
    from .pom import triton_kernels as tk

    out: List[Build] = []
    mode = dict(K=2, ACT=0, GATE=0, HAS_W=1, MEAN=1)
    d = tk.default_launch_config()
    configs = sorted(tk.all_launch_configs(), key=lambda c: (c[0] != d, c[1], c[0].block_d))  # the default first
    for cfg, rotary in configs:
        bn, bd, nw, rope = cfg.block_n, cfg.block_d, cfg.num_warps, int(rotary)
        tiles = dict(BLOCK_N=bn, BLOCK_D=bd)
        base = {**mode, "ROPE": rope, **tiles}
        for given in (0, 1):
            out.append(Build("pom", "tail", tuple({**base, "GIVEN": given}.items()), num_warps=nw))
        for direct, given in ((1, 0), (0, 0), (0, 1)):
            out.append(Build("pom", "scan", tuple({**base, "DIRECT": direct, "GIVEN": given}.items()),
                             num_warps=nw))
        out.append(Build("pom", "gate", tuple(dict(GATE=0, ROPE=rope, MEAN=1, **tiles).items()), num_warps=nw))
        out.append(Build("pom", "causal_head", tuple(dict(GATE=0, ROPE=rope, HAS_W=1, MEAN=1, **tiles).items()),
                         num_warps=nw))
        for gb in sorted({1, min(bd, 64)}):
            out.append(Build("pom", "causal_backward", tuple({**base, "GBLOCK": gb}.items()), num_warps=nw))
            out.append(Build("pom", "end_backward", tuple(dict(GATE=0, ROPE=rope, MEAN=1, GBLOCK=gb,
                                                               **tiles).items()), num_warps=nw))
        out.append(Build("pom", "end_poly", tuple(dict(K=2, ACT=0, ROPE=rope, HAS_W=1, **tiles).items()),
                         num_warps=nw))
    from .value_pom import triton_kernels as vk

    for chunk, bk, bv, nw in sorted(vk.launch_tiles(), key=lambda t: t != vk.default_tiles()):
        for name in vk.KERNELS:
            out.append(Build("value_pom", name, (("K", 1), ("CHUNK", chunk), ("BLOCK_K", bk), ("BLOCK_V", bv),
                                                 ("PREC", "tf32")),
                             "fp32", nw))
    out = [Build(b.op, b.kernel, tuple((k, v) for k, v in b.constexprs if k in _kernel(b.op, b.kernel).arg_names),
                 b.dtype, b.num_warps) for b in out]  # only the kernel's own constexprs
    out = list(dict.fromkeys(out))
    if representative:
        seen, rep = set(), []
        for b in out:
            if b.kernel not in seen:
                seen.add(b.kernel)
                rep.append(b)
        return rep
    return out


def _ptxas() -> str:
    """The newest ptxas the Triton wheel ships (its PTX may be of a version only that one reads)."""
    import triton

    folder = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    for name in ("ptxas-blackwell", "ptxas"):
        if (folder / name).is_file():
            return str(folder / name)
    raise FileNotFoundError(f"no ptxas in {folder}: this Triton wheel ships none")


def build(b: Build, arch: int) -> Dict[str, Any]:
    """Compile one build for sm_<arch>: {kernel, config, arch, registers, spills, shared_bytes, ok, error}."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    row: Dict[str, Any] = {"op": b.op, "kernel": b.kernel, "config": b.config, "arch": f"sm_{arch}"}
    try:
        fn = _kernel(b.op, b.kernel)
        src = ASTSource(fn=fn, signature=_signature(fn, b),
                        constexprs={k: v for k, v in b.constexprs if k in fn.arg_names})
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": b.num_warps})
        target = re.search(r"^\.target\s+(\S+)", compiled.asm["ptx"], flags=re.M)
        with tempfile.TemporaryDirectory() as tmp:
            ptx = Path(tmp) / "k.ptx"
            ptx.write_text(compiled.asm["ptx"])
            res = subprocess.run([_ptxas(), "-v", f"--gpu-name={target.group(1) if target else f'sm_{arch}'}",
                                  str(ptx), "-o", str(Path(tmp) / "k.cubin")], capture_output=True, text=True,
                                 timeout=600)
        info = res.stdout + res.stderr
        if res.returncode:
            raise RuntimeError(f"ptxas failed: {info.strip()[-400:]}")
        regs = re.search(r"Used (\d+) registers", info)
        spill_st = re.search(r"(\d+) bytes spill stores", info)
        spill_ld = re.search(r"(\d+) bytes spill loads", info)
        smem = re.search(r"(\d+) bytes smem", info)
        shared = int(compiled.metadata.shared) + (int(smem.group(1)) if smem else 0)
        row.update(registers=int(regs.group(1)) if regs else None,
                   spills=(int(spill_st.group(1)) if spill_st else 0) + (int(spill_ld.group(1)) if spill_ld else 0),
                   shared_bytes=shared, ok=True, error=None)
        limit = SHARED_LIMIT.get(arch)
        if limit is not None and shared > limit:
            row.update(ok=False, error=f"{shared} bytes of shared memory > sm_{arch}'s {limit}")
    except Exception as e:  # a compile error is a row of the table, not a crash of the command
        row.update(registers=None, spills=None, shared_bytes=None, ok=False,
                   error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
    return row


def build_all(archs: Sequence[int], representative: bool = False, progress: bool = True) -> List[Dict[str, Any]]:
    """Every build for every arch (rows in the order of :func:`builds`)."""
    from tqdm.auto import tqdm

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    todo = [(b, a) for b in builds(representative) for a in archs]
    return [build(b, a) for b, a in tqdm(todo, desc="kernels", disable=not progress, dynamic_ncols=True)]


def summarise(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (kernel, arch): how many configurations were built, how many compiled, the most registers,
    spilled bytes and shared memory of any of them (the guide's table)."""
    out: Dict[Tuple[str, int], Dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault((r["kernel"], r["arch"]), {"kernel": r["kernel"], "arch": r["arch"], "builds": 0,
                                                      "compiled": 0, "max_registers": 0, "max_spills": 0,
                                                      "max_shared_kb": 0.0})
        s["builds"] += 1
        if r["ok"]:
            s["compiled"] += 1
            s["max_registers"] = max(s["max_registers"], r["registers"] or 0)
            s["max_spills"] = max(s["max_spills"], r["spills"] or 0)
            s["max_shared_kb"] = max(s["max_shared_kb"], round((r["shared_bytes"] or 0) / 1024, 1))
    return list(out.values())


def _arch(text: str) -> int:
    m = re.fullmatch(r"(?:sm_?)?(\d+)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"an architecture is sm_80, sm_90, …; got {text!r}")
    return int(m.group(1))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", nargs="+", type=_arch, default=[80, 90], metavar="SM",
                   help="NVIDIA architectures to build for (sm_80 = A100, sm_90 = H100)")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write the rows as a JSON list (kernel, config, arch, registers, spills, shared_bytes)")
    p.add_argument("--representative", action="store_true", help="one build per kernel instead of every one")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise ValueError("TRITON_INTERPRET is set: unset it to build real kernels")
    from ..report import format_table

    rows = build_all(args.arch, args.representative, progress=not args.quiet)
    print(format_table(rows, ["kernel", "config", "arch", "registers", "spills", "shared_bytes", "error"],
                       ["kernel", "configuration", "arch", "registers", "spills", "shared bytes", "error"]))
    print("\nper kernel and architecture (the most of any configuration)")
    print(format_table(summarise(rows), ["kernel", "arch", "builds", "compiled", "max_registers", "max_spills",
                                         "max_shared_kb"],
                       ["kernel", "arch", "configurations", "compiled", "registers (max)", "spilled bytes (max)",
                        "shared KB (max)"]))
    bad = [r for r in rows if not r["ok"] or r["spills"]]
    print(f"\n{len(rows)} builds, {sum(r['ok'] for r in rows)} compiled, "
          f"{sum(1 for r in rows if r['spills'])} with register spills"
          + (f", {sum(1 for r in rows if not r['ok'])} failed" if any(not r["ok"] for r in rows) else ""))
    if args.json:
        keep = ("op", "kernel", "config", "arch", "registers", "spills", "shared_bytes", "ok", "error")
        Path(args.json).write_text(json.dumps([{k: r[k] for k in keep} for r in rows], indent=1))
    return 1 if bad else 0
