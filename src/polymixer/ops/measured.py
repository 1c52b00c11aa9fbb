"""The measured table: where a GPU timed each Triton route against the torch form, and what the automatic choice makes
of it.

A Triton route is taken automatically only where it was *measured* faster than the torch form on this kind of GPU
for this kind of call, on the very kernel code that runs now — or, where nothing was measured for the call, where the
cost model, recomputed from measured bandwidth, predicts it faster (only for routes given a model: PoM's unfused
kernels). Everything else stays out of the automatic choice until a measurement says otherwise. An explicit
``backend(...)`` never looks here (it is strict).

**The table** (``measured.json`` beside this module, shipped with the package; ``POLYMIXER_MEASURED_TABLE=path`` or
:func:`use_table` reads another) is built by :mod:`polymixer.experiments.bench.dispatch_table` from what ``polymixer
bench mixer
--device cuda`` wrote. Its format (``"format": "polymixer.measured/1"``)::

    {"format": ..., "margin": 0.95, "runs": [{
        "source": "docs/bench/gpu_h200/mixer.json", "arch": "sm_90", "gpu": "NVIDIA H200", "date": ..., "torch": ...,
        "kernels": {"pom": "<sha256[:12] of ops/pom/triton_kernels.py>", "value_pom": "<… value_pom/…>"},
        "shape": {"dim": 512, "poly_dim": 1024, "dtype": "bf16", ...}, "note": "provenance, in words",
        "entries": [{"op": "pom", "backend": "triton", "mode": "causal", "pass": "forward", "dtype": "bf16",
                     "length": 4096, "tokens": 65536, "N": 4096, "batch": 16, "ms": 0.88, "torch_ms": 2.86,
                     "rivals": {}, "ratio": 0.31, "faster": true}, ...],
        "efficiency": {"pom": {"forward": {"kernels_bytes_per_s": ..., "torch_bytes_per_s": ...,
                                           "kernels_fraction": ..., "torch_fraction": ..., "fused_flops_fraction": ...,
                                           "kernel_passes": {"causal": {...}, "end": {...}}},
                               "forward+backward": {...}}}}]}

An entry says, for one GPU architecture (``sm_90``: H100 and H200 alike), op, backend, mode class (:func:`mode_class`),
pass (``forward`` — not differentiated — or ``forward+backward``), dtype and size class (``length`` and ``tokens``:
the upper edge of the bucket of N and of B·N, :func:`size_bucket`), the median times of the route and of the torch
form, of the other Triton routes timed beside it (``rivals``), and whether the route was faster than all of them by
the table's ``margin`` (an entry of another size of the same layer — the value PoM at attention's size — says
``variant``). An entry applies only where its run's kernel hash for the op equals the hash of the kernel source
installed now (:func:`kernel_hash`): a measurement of other kernel code decides nothing. A run's ``efficiency`` is
the bandwidth PoM's mixing kernels (their counted passes, ``kernel_passes``) and its torch form reached in it.

**The rules** (:func:`verdict`, in order; the one that decided is named in ``polymixer.backend_for`` and the DEBUG
log): ``table entry`` — entries match the call: the route is taken when every one of them says faster; ``model`` —
none matches, and the route has a model (:func:`polymixer.ops.pom.cost.pom_kernels_vs_torch`): taken when the model,
at the measured bandwidths, predicts it faster; ``no measurement`` — neither: the route is passed over.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple, Union

import torch

from .common import is_compiling, operand_dtype, triton_possible

__all__ = ["FORMAT", "TABLE_PATH", "KERNEL_FILES", "RULES", "PASSES", "Case", "Verdict", "kernel_hash", "size_bucket",
           "arch_of", "dtype_name", "mode_class", "load", "use_table", "table", "case_of", "verdict", "rule",
           "efficiency", "bandwidth_ratio"]

FORMAT = "polymixer.measured/1"
TABLE_PATH = Path(__file__).with_name("measured.json")
RULES = ("table entry", "model", "no measurement")
PASSES = ("forward", "forward+backward")
# the source file whose kernels each op's Triton routes run (both PoM routes run the kernels of one file)
KERNEL_FILES = {"pom": Path(__file__).parent / "pom" / "triton_kernels.py",
                "value_pom": Path(__file__).parent / "value_pom" / "triton_kernels.py"}
_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


class Case(NamedTuple):
    """What the table and the model need to know of a call: plain values (hashable, constant under torch.compile)."""

    op: str
    device_type: str
    device_index: Optional[int]
    mode: str  # mode class, :func:`mode_class`
    length: int  # size bucket of N
    tokens: int  # size bucket of B·N
    dtype: str  # the kernels' dtype: "bf16", "fp16", "fp32"
    passes: str  # "forward" or "forward+backward"
    gate_head: int  # channels per gate (PoM; 1 for the value PoM)


class Verdict(NamedTuple):
    """Whether the automatic choice takes a route, which rule decided (:data:`RULES`) and why, in words."""

    taken: bool
    rule: str
    reason: str


# ----------------------------------------------------------------------------------------------------------------
# what a call is, in the table's terms
# ----------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def kernel_hash(op: str) -> Optional[str]:
    """The first 12 hex digits of the sha256 of ``op``'s kernel source file (read, never imported: a CPU call must not
    import Triton); None when the file is not there. Computed once per process (``kernel_hash.cache_clear()``
    forgets it)."""
    path = KERNEL_FILES.get(op)
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path is not None else None
    except OSError:
        return None


def size_bucket(n: Any) -> int:
    """The upper edge of ``n``'s size class: 1024·4^k, the smallest ≥ n (1024 for anything smaller). Comparisons
    only, so that under torch.compile a symbolic size becomes a guarded constant."""
    b = 1024
    while b < n:
        b *= 4
    return b


def arch_of(device_type: str, device_index: Optional[int]) -> Optional[str]:
    """``"sm_90"`` for a CUDA device of compute capability 9.0 (H100, H200); None elsewhere."""
    if device_type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device_index)
    return f"sm_{major}{minor}"


def dtype_name(dtype: torch.dtype) -> str:
    """"bf16", "fp16", "fp32" (the table's names)."""
    return _DTYPES.get(dtype, str(dtype).replace("torch.", ""))


def mode_class(causal: bool, block_size: Optional[int], packed: bool, rope: Optional[str]) -> str:
    """The mode class of a call: causal / full / block-causal, "packed " before it for packed sequences, " rotary"
    after it with rotary positions (key padding runs the same kernels and is not a class of its own)."""
    mode = "block-causal" if block_size else "causal" if causal else "full"
    return ("packed " if packed else "") + mode + (f" {rope} rotary" if rope else "")


def _differentiated(tensors: Tuple[Any, ...]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _pow2_at_least(n: Any) -> int:
    b = 1
    while b < n:
        b *= 2
    return b


def case_of(op: str, call: Any) -> Case:
    """The :class:`Case` of a ``pom`` or ``value_pom`` call (:class:`polymixer.ops.call.Call`). PoM's kernels are
    differentiated when x or a weight they read needs a gradient (W_o's is cuBLAS's)."""
    x, w = call.x, call.weights
    mode = mode_class(bool(call.causal), call.block_size, call.cu_k is not None, call.rope)
    if op == "pom":
        train = _differentiated((x, w.in_weight, w.coeff, w.gate_bias))
        gate_head = _pow2_at_least(call.D // call.Ds)
    else:
        train = _differentiated(call.tensors())
        gate_head = 1
    return Case(op, x.device.type, x.device.index, mode, size_bucket(call.N), size_bucket(call.B * call.N),
                dtype_name(operand_dtype(x)), PASSES[1] if train else PASSES[0], gate_head)


# ----------------------------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------------------------

_STATE: Dict[str, Any] = {"table": None, "override": []}


def load(path: Union[str, Path]) -> Dict[str, Any]:
    """Read a table and check its format (ValueError naming the file when it is not one)."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("runs"), list):
        raise ValueError(f"{path} is not a measured table (format {FORMAT!r} with a list of runs)")
    return data


def table() -> Dict[str, Any]:
    """The table in force: :func:`use_table`'s, else ``POLYMIXER_MEASURED_TABLE``'s file, else the shipped one (an
    empty table where that file is missing)."""
    if _STATE["override"]:
        return _STATE["override"][-1]
    if _STATE["table"] is None:
        chosen = os.environ.get("POLYMIXER_MEASURED_TABLE")
        if chosen:
            _STATE["table"] = load(chosen)
        else:
            _STATE["table"] = load(TABLE_PATH) if TABLE_PATH.exists() else {"format": FORMAT, "runs": []}
    return _STATE["table"]


@contextlib.contextmanager
def use_table(source: Union[str, Path, Dict[str, Any]]) -> Iterator[Dict[str, Any]]:
    """Decide from ``source`` (a table, or the path of one) inside the block — to try a table built from a new
    bench run before shipping it, and in tests."""
    data = load(source) if isinstance(source, (str, Path)) else source
    if data.get("format") != FORMAT:
        raise ValueError(f"not a measured table (format {FORMAT!r})")
    _STATE["override"].append(data)
    try:
        yield data
    finally:
        _STATE["override"].pop()


def _matches(entry: Dict[str, Any], run: Dict[str, Any], case: Case, backend: str) -> bool:
    """Whether ``entry`` of ``run`` measured ``backend`` on ``case``'s kind of call (the kernel hash aside)."""
    dtype = entry.get("dtype", run.get("shape", {}).get("dtype"))
    return (entry.get("op"), entry.get("backend"), entry.get("mode"), entry.get("pass"), entry.get("length"),
            entry.get("tokens"), dtype) == (case.op, backend, case.mode, case.passes, case.length, case.tokens,
                                            case.dtype)


def _entries(case: Case, backend: str, arch: Optional[str]) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(the entries of this case measured on the kernels installed now, the kernel hashes of the runs that measured
    this case on other kernel code)."""
    now = kernel_hash(case.op)
    fresh: List[Dict[str, Any]] = []
    stale: List[str] = []
    for run in table()["runs"]:
        if run.get("arch") != arch:
            continue
        hits = [e for e in run.get("entries", ()) if _matches(e, run, case, backend)]
        if not hits:
            continue
        measured_on = run.get("kernels", {}).get(case.op)
        if now is not None and measured_on == now:
            fresh += [dict(e, gpu=run.get("gpu", "?")) for e in hits]
        else:
            stale.append(str(measured_on))
    return fresh, stale


def _efficiency_records(op: str, passes: str) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """(run, its efficiency record) of every run that measured ``op``'s kernels in ``passes``."""
    out = []
    for run in table()["runs"]:
        rec = run.get("efficiency", {}).get(op, {}).get(passes)
        if rec:
            out.append((run, rec))
    return out


def efficiency(op: str, passes: str) -> Optional[Dict[str, float]]:
    """The most conservative measured efficiencies of ``op``'s kernels over every run (any card, any kernel code —
    the only figures there are until the kernels in use are measured), as fractions of the card's datasheet
    figures: the slowest mixing kernels (``kernels_fraction`` of HBM bandwidth), the fastest torch form
    (``torch_fraction``), the slowest fused route (``fused_flops_fraction`` of the tensor-core peak); a key is
    missing where no run has it, and the answer is None where no run measured ``op``."""
    records = [rec for _, rec in _efficiency_records(op, passes)]
    if not records:
        return None
    out: Dict[str, float] = {}
    for key, pick in (("kernels_fraction", min), ("torch_fraction", max), ("fused_flops_fraction", min)):
        values = [rec[key] for rec in records if rec.get(key)]
        if values:
            out[key] = pick(values)
    return out


def bandwidth_ratio(op: str, passes: str) -> Optional[Tuple[float, Dict[str, Any]]]:
    """The lowest measured ratio of the mixing kernels' bandwidth to the torch form's over every run (the ratio is
    what the model's verdict needs: the card's own bandwidth cancels), with the figures and where they came from:
    (ratio, {"kernels_bytes_per_s", "torch_bytes_per_s", "gpu", "arch", "kernels"}); None without a measurement."""
    best: Optional[Tuple[float, Dict[str, Any]]] = None
    for run, rec in _efficiency_records(op, passes):
        if not rec.get("kernels_bytes_per_s") or not rec.get("torch_bytes_per_s"):
            continue
        ratio = rec["kernels_bytes_per_s"] / rec["torch_bytes_per_s"]
        if best is None or ratio < best[0]:
            best = (ratio, {"kernels_bytes_per_s": rec["kernels_bytes_per_s"],
                            "torch_bytes_per_s": rec["torch_bytes_per_s"], "gpu": run.get("gpu", "?"),
                            "arch": run.get("arch", "?"), "kernels": run.get("kernels", {}).get(op)})
    return best


# ----------------------------------------------------------------------------------------------------------------
# the verdict
# ----------------------------------------------------------------------------------------------------------------

Model = Callable[[Case], Optional[Tuple[bool, str]]]


def _what(case: Case) -> str:
    size = f"N ≤ {case.length:,}, B·N ≤ {case.tokens:,}"
    return f"{case.mode}, {case.passes}, {case.dtype}, {size}"


def _from_entries(case: Case, arch: str, entries: List[Dict[str, Any]]) -> Verdict:
    """The verdict of the entries that match a call: taken when all say faster; the times of one that does not (or
    of the first) in words — "slower" meaning slower than the torch form or a route tried after this one."""
    slow = [e for e in entries if not e.get("faster")]
    shown = slow[0] if slow else entries[0]
    times = f"{shown['ms']:.3g} ms against the torch form's {shown['torch_ms']:.3g} ms"
    rivals = shown.get("rivals") or {}
    if rivals:
        times += "".join(f", {name}'s {ms:.3g} ms" for name, ms in rivals.items())
    layer = f"{shown['variant']} layer, " if shown.get("variant") else ""
    where = (f"on {arch} ({shown.get('gpu', '?')}, {layer}N {shown.get('N')} × batch {shown.get('batch')}), "
             f"{_what(case)}")
    if slow:
        return Verdict(False, RULES[0], f"measured slower {where}: {times}")
    return Verdict(True, RULES[0], f"measured faster {where}: {times}")


def _verdict(op: str, backend: str, model: Optional[Model], *fields: Any) -> Tuple[bool, str, str]:
    case = Case(*fields)  # the fields one by one: dynamo hands constants to assume_constant_result, not named tuples
    arch = arch_of(case.device_type, case.device_index)
    fresh, stale = _entries(case, backend, arch)
    if fresh:
        return tuple(_from_entries(case, arch or "?", fresh))  # type: ignore[return-value]
    now = kernel_hash(op)
    note = ""
    if stale:
        note = (f" (the table's measurement of this case on {arch} ran other kernel code, "
                f"{', '.join(sorted(set(stale)))}; these kernels are {now})")
    if model is not None:
        predicted = model(case)
        if predicted is not None:
            faster, why = predicted
            return faster, RULES[1], why + note
    where = arch or f"{case.device_type} (no GPU architecture)"
    return False, RULES[2], (f"nothing measured {backend} on these kernels ({now}) faster than the torch form on "
                             f"{where} for {_what(case)}{note}")


# dynamo runs the verdict eagerly while it traces (it reads the table and the kernel source) and keeps the answer. Only
# where Triton could run: importing torch._dynamo imports Triton, and a verdict is asked for only after a Triton
# backend took the call — never where Triton cannot run.
_traced_verdict = torch._dynamo.assume_constant_result(_verdict) if triton_possible() else None


def verdict(op: str, backend: str, case: Case, model: Optional[Model] = None) -> Verdict:
    """Whether the automatic choice takes ``backend`` for ``case``, by which rule (:data:`RULES`), and why."""
    if not is_compiling():
        return Verdict(*_verdict(op, backend, model, *case))
    if _traced_verdict is None:  # unreachable: no Triton backend takes a call where Triton cannot run
        return Verdict(False, RULES[2], "Triton cannot run in this process")
    return Verdict(*_traced_verdict(op, backend, model, *case))


def rule(op: str, backend: str, model: Optional[Model] = None) -> Callable[[Any], Verdict]:
    """The dispatcher's speed rule of route ``backend`` of ``op`` (``dispatch.register(..., speed=rule(...))``):
    call → :class:`Verdict`."""

    def speed(call: Any) -> Verdict:
        return verdict(op, backend, case_of(op, call), model)

    speed.__name__ = f"speed_{op}_{backend}"
    return speed
