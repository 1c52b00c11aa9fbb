"""Ahead-of-time builds of the Triton kernels for NVIDIA GPUs, without a GPU: ``polymixer kernels``.

``triton.compile`` lowers each kernel to PTX for a target (``GPUTarget("cuda", 90, 32)`` for sm_90), and the
``ptxas`` the Triton wheel ships assembles it with ``-v``: registers per thread, spill stores and loads, shared
memory. A compile error, a kernel over the target's shared memory, one that spills or one whose registers allow a
single block per SM shows here on a CPU-only machine, before anyone runs it on a GPU.

The builds are those a user's JIT makes: the argument types of a real call (activations fp32 / bf16 / fp16,
parameters and sums fp32, positions fp64, masks u8, offsets i32) and the JIT's specialisation of aligned arguments
(``tt.divisibility = 16`` on every pointer and on the strides and widths a real model makes multiples of 16). Every
kernel is built at every launch configuration the dispatcher can pick, on both routes (z in memory, and the fused
input projection), and in a covering set of the rest: every degree 1–5, every activation and gate, every dtype.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from ..tasks.common import int_at_least

__all__ = ["Build", "builds", "build", "build_all", "summarise", "occupancy", "SHARED_LIMIT", "F64_SCALARS",
           "add_arguments", "main"]

# the most shared memory one block may use (bytes): sm_80 (A100) 163 KB, sm_90 (H100) 227 KB; and per SM
SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
SHARED_PER_SM = {80: 164 * 1024, 86: 100 * 1024, 89: 100 * 1024, 90: 228 * 1024}
REGISTERS_PER_SM = 65536
THREADS_PER_SM = {80: 2048, 86: 1536, 89: 1536, 90: 2048}


@dataclass(frozen=True)
class Build:
    """One kernel specialisation to build: the kernel's name, its constexprs and the element type of its
    activations."""

    op: str
    kernel: str
    constexprs: Tuple[Tuple[str, Any], ...]
    dtype: str = "bf16"  # the activations' element type (z, x, g and their gradients); parameters stay fp32
    num_warps: int = 4
    maxnreg: int = 255  # the launches' register bound (ptxas then spills only past it; 4 warps × 255 < 2 CTAs' worth)
    num_stages: int = 0  # software pipelining of the loops' loads (0: Triton's default)
    archs: Tuple[int, ...] = ()  # the architectures it is launched on (empty: every one)

    @property
    def config(self) -> str:
        c = dict(self.constexprs)
        keys = ("BLOCK_N", "BLOCK_D", "BLOCK_K", "GB", "C", "BK", "BV")
        tiles = "×".join(str(c[k]) for k in keys if k in c)
        flags = ",".join(f"{k}={v}" for k, v in self.constexprs if k not in keys)
        stages = f" s{self.num_stages}" if self.num_stages else ""
        return f"{tiles} w{self.num_warps}{stages} {self.dtype} [{flags}]"


# pointer arguments whose element type follows the activations; integer, byte and float64 ones; the others fp32
_ACT_POINTERS = {"z_ptr", "x_ptr", "win_ptr", "g_ptr", "dz_ptr", "dg_ptr", "q_ptr", "k_ptr", "v_ptr", "o_ptr",
                 "do_ptr", "dq_ptr", "dk_ptr", "dv_ptr"}
# the value PoM's chunk states: bf16 beside bf16 activations, fp32 otherwise (fp16 would overflow at long N)
_STATE_POINTERS = {"h_ptr", "dh_ptr"}
_INT_POINTERS = {"seqid_ptr", "cu_ptr", "has_ptr", "seg_ptr", "first_ptr"}
_BYTE_POINTERS = {"w_ptr"}
_F64_POINTERS = {"pos_ptr"}
_FLOAT_SCALARS = {"scale"}
# float arguments the kernels annotate as float64 (``log2base: tl.float64``: rotary angles stay exact at long range)
F64_SCALARS = {"log2base"}
# integer arguments that a real model makes multiples of 16 (strides and widths): the JIT marks them divisible
_ALIGNED_INTS = re.compile(r"^(s_\w+|D|half|d|DK|DV|W)$")


def _signature(fn: Any, b: Build) -> Tuple[Dict[str, str], Dict[Tuple[int, ...], List[List[Any]]]]:
    consts = {k: v for k, v in b.constexprs if k in fn.arg_names}
    act = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}[b.dtype]
    sig: Dict[str, str] = {}
    attrs: Dict[Tuple[int, ...], List[List[Any]]] = {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        if name.endswith("_ptr"):
            sig[name] = "*" + (act if name in _ACT_POINTERS else ("bf16" if act == "bf16" else "fp32")
                               if name in _STATE_POINTERS else "i32" if name in _INT_POINTERS
                               else "u8" if name in _BYTE_POINTERS else "fp64" if name in _F64_POINTERS else "fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in F64_SCALARS:
            sig[name] = "fp64"
        elif name in _FLOAT_SCALARS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if _ALIGNED_INTS.match(name):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def _kernel(op: str, name: str) -> Any:
    if op == "pom":
        from ...ops.pom import triton_kernels as tk
    elif op == "gated":
        from ...ops.gated_value_pom import triton_kernels as tk  # type: ignore[no-redef]
    else:
        from ...ops.value_pom import triton_kernels as tk  # type: ignore[no-redef]
    return tk.KERNELS[name]


DTYPE_NAMES = ("fp32", "bf16", "fp16")


def _pom_builds() -> Tuple[List[Build], List[Build]]:
    """(every tile of :data:`~polymixer.ops.pom.triton_kernels.TILES` — route × rotary × gate-head class × role —
    at the heaviest flags (degree 5, gelu, key padding, positions, packing; fp32 activations for the unfused route,
    bf16 for the fused one's products), causal and block-causal, and the scan kernel both ways; the covering set of
    degrees, activations, gates and dtypes at the default tiles of both routes)."""
    from ...ops.pom import triton_kernels as tk

    heavy = dict(K=5, ACT=4, GATE=1, HAS_W=1, HAS_POS=1, PACKED=1, MEAN=1)  # gelu: the activation with most values

    def one(role: str, tile: Tuple[int, int], fused: bool, rope: bool, gb: int, flags: Dict[str, Any], mode: int,
            dtype: str = "bf16") -> Build:
        bn, bd = tile
        c = {**flags, "MODE": mode, "ROPE": 2 if rope else 0, "FUSED": int(fused), "GB": gb,
             "NSP": max(16, bd // gb), "NS": max(1, bd // gb), "HP": max(1, gb // bd),
             "KP": tk.pow2(flags["K"]), "BLOCK_N": bn, "BLOCK_D": bd, "BLOCK_K": 32 if fused else 16,
             "PREC": "tf32", "STAGES": tk.STAGES[role]}
        return Build("pom", role, tuple(c.items()), dtype, 4)

    main: List[Build] = []
    default = [(False, False, 16), (True, False, 16)]
    for key in sorted(tk.TILES, key=lambda k: (k not in default, k)):  # the default tiles first
        fused, rope, hc = key
        # the fused route: the heads of its class; the unfused one: heads within a tile, a head per tile, split heads
        heads = ((1, 16) if hc == 16 else (hc,)) if fused else (1, 16, 64, 128)
        for gb in heads:
            for role, tile in tk.TILES[key].items():
                if tile is not None:  # the fused route at its own heaviest (bf16: its products' operands)
                    flags = {**heavy, "ACT": 0, "GATE": 0} if fused else heavy
                    main += [one(role, tile, fused, rope, gb, flags, mode, "bf16" if fused else "fp32")
                             for mode in (0, 2)]
    for reverse in (0, 1):
        for packed in (0, 1):
            c = dict(PACKED=packed, REVERSE=bool(reverse), HAS_WT=1 - reverse, CB=tk.SCAN_CHUNKS,
                     BLOCK_S=tk.SCAN_CHANNELS)
            main.append(Build("pom", "scan", tuple(c.items()), "fp32", 4))
    cover: List[Build] = []
    for i in range(6):  # every degree, activation, gate and dtype at least once per kernel and route
        flags = dict(K=i % 5 + 1, ACT=i, GATE=i % 3, HAS_W=i % 2, HAS_POS=0, PACKED=(i + 1) % 2, MEAN=1)
        for fused in (False, True):
            for role in tk.ROLES:
                tile = tk.TILES[(fused, False, 16)][role]
                cover.append(one(role, tile, fused, False, 1, flags, i % 3, DTYPE_NAMES[i % 3]))  # type: ignore[arg-type]
    return main, cover


def builds(representative: bool = False) -> List[Build]:
    """Every (kernel, launch configuration, route, flags) the builds cover; ``representative``: one per kernel at
    the default configuration (the unfused and the fused route of PoM, the tiles of a 64 × 64 head for the value
    PoM)."""
    main, cover = _pom_builds()
    out = main + cover
    from ...ops.value_pom import triton_kernels as vk

    out += vk.aot_builds(Build)
    from ...ops.gated_value_pom import triton_kernels as gk

    out += gk.aot_builds(Build)
    out = [Build(b.op, b.kernel, tuple((k, v) for k, v in b.constexprs if k in _kernel(b.op, b.kernel).arg_names),
                 b.dtype, b.num_warps, b.maxnreg, b.num_stages, b.archs) for b in out]  # only the kernel's constexprs
    out = list(dict.fromkeys(out))
    if representative:
        seen, rep = set(), []
        for b in out:
            key = (b.kernel, dict(b.constexprs).get("FUSED", 0), dict(b.constexprs).get("DQ", 0), b.archs)
            if key not in seen:
                seen.add(key)
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


def occupancy(registers: int, num_warps: int, shared: int, arch: int) -> int:
    """Blocks per SM the registers, threads and shared memory of one build allow (registers are allocated per warp
    in units of 256)."""
    per_warp = -(-registers * 32 // 256) * 256
    by_regs = REGISTERS_PER_SM // max(1, per_warp * num_warps)
    by_threads = THREADS_PER_SM.get(arch, 2048) // (32 * num_warps)
    by_shared = SHARED_PER_SM.get(arch, 100 * 1024) // (shared + 1024) if shared else 32
    return int(min(by_regs, by_threads, by_shared, 32))


def build(b: Build, arch: int) -> Dict[str, Any]:
    """Compile one build for sm_<arch>: {op, kernel, config, arch, registers, spills, shared_bytes, ctas_per_sm, ok,
    error}."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    row: Dict[str, Any] = {"op": b.op, "kernel": b.kernel, "config": b.config, "arch": f"sm_{arch}"}
    try:
        fn = _kernel(b.op, b.kernel)
        sig, attrs = _signature(fn, b)
        src = ASTSource(fn=fn, signature=sig, constexprs={k: v for k, v in b.constexprs if k in fn.arg_names},
                        attrs=attrs)
        options = {"num_warps": b.num_warps, **({"maxnreg": b.maxnreg} if b.maxnreg else {}),
                   **({"num_stages": b.num_stages} if b.num_stages else {})}
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
        target = re.search(r"^\.target\s+(\S+)", compiled.asm["ptx"], flags=re.M)
        with tempfile.TemporaryDirectory() as tmp:
            ptx = Path(tmp) / "k.ptx"
            ptx.write_text(compiled.asm["ptx"])
            # the flags of Triton's own make_cubin, so that registers and spills are those the JIT gets
            res = subprocess.run([_ptxas(), "-lineinfo", "-v", "--regAllocOptLevel=2",
                                  f"--gpu-name={target.group(1) if target else f'sm_{arch}'}", str(ptx), "-o",
                                  str(Path(tmp) / "k.cubin")], capture_output=True, text=True, timeout=600)
        info = res.stdout + res.stderr
        if res.returncode:
            raise RuntimeError(f"ptxas failed: {info.strip()[-400:]}")
        regs = re.search(r"Used (\d+) registers", info)
        spill_st = re.search(r"(\d+) bytes spill stores", info)
        spill_ld = re.search(r"(\d+) bytes spill loads", info)
        smem = re.search(r"(\d+) bytes smem", info)
        shared = int(compiled.metadata.shared) + (int(smem.group(1)) if smem else 0)
        registers = int(regs.group(1)) if regs else 0
        row.update(registers=registers,
                   spills=(int(spill_st.group(1)) if spill_st else 0) + (int(spill_ld.group(1)) if spill_ld else 0),
                   shared_bytes=shared, ctas_per_sm=occupancy(registers, b.num_warps, shared, arch), ok=True,
                   error=None)
        limit = SHARED_LIMIT.get(arch)
        if limit is not None and shared > limit:
            row.update(ok=False, error=f"{shared} bytes of shared memory > sm_{arch}'s {limit}")
    except Exception as e:  # a compile error is a row of the table, not a crash of the command
        row.update(registers=None, spills=None, shared_bytes=None, ctas_per_sm=None, ok=False,
                   error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
    return row


def _build_one(item: Tuple[Build, int]) -> Dict[str, Any]:
    return build(*item)


def build_all(archs: Sequence[int], representative: bool = False, progress: bool = True,
              jobs: int = 0) -> List[Dict[str, Any]]:
    """Every build for every arch (rows in the order of :func:`builds`), ``jobs`` processes at once (0: one per
    CPU core)."""
    from tqdm.auto import tqdm

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    todo = [(b, a) for b in builds(representative) for a in archs if not b.archs or a in b.archs]
    jobs = jobs or os.cpu_count() or 1
    bar = tqdm(total=len(todo), desc="kernels", disable=not progress, dynamic_ncols=True)
    if jobs == 1:
        rows = []
        for item in todo:
            rows.append(_build_one(item))
            bar.update()
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            rows = []
            for row in pool.map(_build_one, todo, chunksize=1):
                rows.append(row)
                bar.update()
    bar.close()
    return rows


def summarise(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per (kernel, arch): how many configurations were built, how many compiled, the most registers,
    spilled bytes and shared memory of any of them, and the fewest blocks per SM (the guide's table)."""
    out: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault((r["kernel"], r["arch"]), {"kernel": r["kernel"], "arch": r["arch"], "builds": 0,
                                                      "compiled": 0, "max_registers": 0, "max_spills": 0,
                                                      "max_shared_kb": 0.0, "min_ctas_per_sm": None})
        s["builds"] += 1
        if r["ok"]:
            s["compiled"] += 1
            s["max_registers"] = max(s["max_registers"], r["registers"] or 0)
            s["max_spills"] = max(s["max_spills"], r["spills"] or 0)
            s["max_shared_kb"] = max(s["max_shared_kb"], round((r["shared_bytes"] or 0) / 1024, 1))
            c = r.get("ctas_per_sm")
            if c is not None:
                s["min_ctas_per_sm"] = c if s["min_ctas_per_sm"] is None else min(s["min_ctas_per_sm"], c)
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
                   help="also write the rows as a JSON list (kernel, config, arch, registers, spills, shared_bytes, "
                        "ctas_per_sm)")
    p.add_argument("--representative", action="store_true",
                   help="one build per kernel and route at the default configuration instead of every one")
    p.add_argument("--jobs", type=int_at_least(0), default=0, help="builds at once (default: one per CPU core)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--traffic", action="store_true",
                   help="count each mode's HBM passes per N·D element in Triton's interpreter instead of building "
                        "(the table of docs/gpu.md)")


def main(args: argparse.Namespace) -> int:
    if getattr(args, "traffic", False):
        from . import traffic

        return traffic.main(args)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise ValueError("TRITON_INTERPRET is set: unset it to build real kernels")
    from ..report import format_table

    rows = build_all(args.arch, args.representative, progress=not args.quiet, jobs=args.jobs)
    print(format_table(rows, ["kernel", "config", "arch", "registers", "spills", "shared_bytes", "ctas_per_sm",
                              "error"],
                       ["kernel", "configuration", "arch", "registers", "spills", "shared bytes", "CTAs / SM",
                        "error"]))
    print("\nper kernel and architecture (the most of any configuration; the fewest blocks per SM)")
    print(format_table(summarise(rows), ["kernel", "arch", "builds", "compiled", "max_registers", "max_spills",
                                         "max_shared_kb", "min_ctas_per_sm"],
                       ["kernel", "arch", "builds", "compiled", "registers (max)", "spilled bytes (max)",
                        "shared KB (max)", "CTAs / SM (min)"]))
    spilled = [r for r in rows if r["ok"] and r["spills"]]
    lonely = [r for r in rows if r["ok"] and (r.get("ctas_per_sm") or 0) < 2]
    failed = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows)} builds, {len(rows) - len(failed)} compiled, {len(spilled)} with register spills, "
          f"{len(lonely)} with fewer than 2 CTAs per SM" + (f", {len(failed)} failed" if failed else ""))
    if args.json:
        keep = ("op", "kernel", "config", "arch", "registers", "spills", "shared_bytes", "ctas_per_sm", "ok", "error")
        Path(args.json).write_text(json.dumps([{k: r[k] for k in keep} for r in rows], indent=1))
    return 1 if failed or spilled or lonely else 0
