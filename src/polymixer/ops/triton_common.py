"""What the Triton backends of every op share: the elementwise pieces inlined into the kernels, 64-bit offsets,
rotary angles computed in the kernels, kernels as PyTorch custom ops, and the first-use check.

Imported only by the Triton backends (``ops/<op>/triton_kernels.py``), so that a CPU-only install never imports
Triton.

**Custom ops.** :func:`kernel_op` makes a host function that launches kernels through :func:`launch` a PyTorch
custom op: ``torch.library.triton_op`` on a GPU (``torch.compile`` and ``torch.export`` see one traceable call whose
kernels inductor can schedule itself), ``torch.library.custom_op`` with an explicit fake implementation under
``TRITON_INTERPRET=1`` (the interpreter cannot take fake tensors, so the op stays opaque; it still compiles under
``aot_eager`` and inductor). Either way dynamo traces no kernel and no graph breaks.

**First-use check.** Kernels verified in the interpreter and compiled ahead of time still run compiled for the first
time on a user's GPU. :func:`first_use` runs a small check there once per (op, device, dtype) — under
``enable_grad``, ``inference_mode(False)``, autocast off, outside fake-tensor tracing and never during CUDA-graph
capture — so that the caller's context cannot make it fail by accident. Under ``torch.compile`` it runs at trace time
(``torch._dynamo.assume_constant_result``).

**Devices.** Triton launches on the current CUDA device. Every launch (:func:`launch`) and the first-use check (in its
own thread, which starts on device 0) run under the device of their tensors (:func:`device_guard`), so that a
data-parallel rank on ``cuda:3`` never launches on GPU 0 with GPU 3's pointers.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Any, Callable, ContextManager, Dict, Iterable, Optional, Tuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError as e:  # pragma: no cover - depends on the environment (the [gpu] extra)
    raise ImportError("the triton backend needs Triton: pip install 'polymixer[gpu]'") from e

__all__ = ["interpreted", "ACT_CODES", "GATE_CODES", "DTYPES", "MAX_DEGREE", "TWO_PI", "sigmoid",
           "act_fn", "act_grad", "gate_fn", "gate_grad", "seg_add", "or_", "offset64", "last_row", "mma",
           "dot_precision", "sequence_of", "end_of", "kernel_op", "launch", "sm_count", "device_guard",
           "tensor_device", "run_in_fresh_thread", "first_use", "check_results", "check_runs", "judge_check",
           "CHECKED", "pow2"]

ACT_CODES = {"leaky_clamp": 0, "relu": 1, "identity": 2, "silu": 3, "gelu": 4, "tanh": 5}
GATE_CODES = {"hardsigmoid": 0, "sigmoid": 1, "identity": 2}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_DEGREE = 5
TWO_PI = tl.constexpr(6.283185307179586)


def interpreted() -> bool:
    """Whether Triton runs its interpreter on CPU tensors (``TRITON_INTERPRET=1``: tests without a GPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def pow2(x: int, least: int = 1) -> int:
    """The smallest power of two ≥ max(x, least)."""
    return 1 << max(0, (max(int(x), least) - 1).bit_length())


# ----------------------------------------------------------------------------------------------------------------
# elementwise pieces (inlined into every kernel)
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def sigmoid(u):
    return 1.0 / (1.0 + tl.exp(-u))


@triton.jit
def act_fn(z, ACT: tl.constexpr):
    """The polynomial's activation by code (:data:`ACT_CODES`)."""
    if ACT == 0:  # leaky ReLU (0.01) clamped to [-0.1, 6]
        y = tl.minimum(tl.maximum(tl.where(z > 0, z, 0.01 * z), -0.1), 6.0)
    elif ACT == 1:
        y = tl.maximum(z, 0.0)
    elif ACT == 2:
        y = z
    elif ACT == 3:
        y = z * sigmoid(z)
    elif ACT == 4:
        y = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    else:
        y = 2.0 * sigmoid(2.0 * z) - 1.0
    return y


@triton.jit
def act_grad(z, ACT: tl.constexpr):
    if ACT == 0:  # 0 at the kinks x = −10 and x = 6, like the torch form's fused backward
        g = tl.where(z > 0, 1.0, 0.01) * tl.where((z > -10.0) & (z < 6.0), 1.0, 0.0)
    elif ACT == 1:
        g = tl.where(z > 0, 1.0, 0.0)
    elif ACT == 2:
        g = z * 0.0 + 1.0
    elif ACT == 3:
        s = sigmoid(z)
        g = s * (1.0 + z * (1.0 - s))
    elif ACT == 4:
        g = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476)) + z * tl.exp(-0.5 * z * z) * 0.3989422804014327
    else:
        t = 2.0 * sigmoid(2.0 * z) - 1.0
        g = 1.0 - t * t
    return g


@triton.jit
def gate_fn(u, GATE: tl.constexpr):
    """The selection gate by code (:data:`GATE_CODES`)."""
    if GATE == 0:
        s = tl.minimum(tl.maximum(u / 6.0 + 0.5, 0.0), 1.0)
    elif GATE == 1:
        s = sigmoid(u)
    else:
        s = u
    return s


@triton.jit
def gate_grad(u, GATE: tl.constexpr):
    if GATE == 0:
        g = tl.where((u > -3.0) & (u < 3.0), 1.0 / 6.0, 0.0)
    elif GATE == 1:
        s = sigmoid(u)
        g = s * (1.0 - s)
    else:
        g = u * 0.0 + 1.0
    return g


@triton.jit
def seg_add(a, fa, b, fb):
    """The combine of a segmented inclusive sum: ``b`` restarts the sum where it starts a segment."""
    return tl.where(fb != 0, b, a + b), fa | fb


@triton.jit
def or_(a, b):
    return a | b


@triton.jit
def mma(a, b, PREC: tl.constexpr):
    """a @ b with fp32 accumulation: bf16 / fp16 operands on tensor cores, fp32 ones in tf32 or exact ("ieee") as
    PREC says; PREC "f32x" casts both to fp32 first (the interpreter, whose bf16 dot is wrong in Triton 3.9)."""
    if PREC == "f32x":
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PREC)
    return out


def dot_precision(t: torch.Tensor) -> str:
    """PREC of :func:`mma` for operands like ``t``: exact in the interpreter, tf32 for fp32 on a GPU when PyTorch
    allows tf32 matmuls (else exact), the tensor cores' own for bf16 / fp16."""
    if interpreted():
        return "f32x"
    if t.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"


@triton.jit
def offset64(i, stride):
    """``i · stride`` in 64 bits: a row or chunk offset that may pass 2³¹ elements (B·N·D ≥ 2³¹ happens at B 32,
    N 16k, D 4k). Kernels add it to a base pointer once per tile and keep their in-tile offsets 32-bit."""
    return (tl.zeros((), tl.int64) + i) * stride


@triton.jit
def last_row(x, rows, last):
    """Row ``last`` of a (rows, channels) tile, as a vector."""
    return tl.sum(tl.where((rows == last)[:, None], x, 0.0), axis=0)


@triton.jit
def sequence_of(n, nmask, seqid_ptr, cu_ptr, N, PACKED: tl.constexpr):
    """Each token's sequence: (id, first token, one past its last token)."""
    if PACKED:
        sid = tl.load(seqid_ptr + n, mask=nmask, other=0)
        s0 = tl.load(cu_ptr + sid, mask=nmask, other=0).to(tl.int32)
        s1 = tl.load(cu_ptr + sid + 1, mask=nmask, other=0).to(tl.int32)
    else:
        sid = n * 0
        s0 = n * 0
        s1 = n * 0 + N
    return sid, s0, s1


@triton.jit
def end_of(n, sid, s0, s1, BS, MODE: tl.constexpr):
    """End-token modes: each query's end token and its row in the end table. Full: its sequence's last token, row =
    the sequence. Block-causal: its block's last token (clipped to the sequence), row = ⌊s0 / bs⌋ + block + sequence
    (injective, < (N − 1) // bs + sequences)."""
    if MODE == 1:
        e = s1 - 1
        eid = sid
    else:
        blk = (n - s0) // BS
        e = tl.minimum(s0 + (blk + 1) * BS - 1, s1 - 1)
        eid = s0 // BS + blk + sid
    return e, eid


# ----------------------------------------------------------------------------------------------------------------
# kernels as custom ops
# ----------------------------------------------------------------------------------------------------------------


def tensor_device(args: Iterable[Any], kwargs: Dict[str, Any]) -> Optional[torch.device]:
    """The device of the first tensor among a launch's arguments (None when there is none)."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device
    return None


def device_guard(device: Optional[torch.device]) -> ContextManager[Any]:
    """``torch.cuda.device(device)`` for a CUDA device with an index, else nothing (the module doc's **Devices**:
    the current device may be another one in a fresh thread, or after a library reset it)."""
    if device is None or device.type != "cuda" or device.index is None:
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def launch(kernel: Any, grid: Tuple[Any, ...], *args: Any, **kwargs: Any) -> None:
    """Launch a Triton kernel through ``torch.library.wrap_triton``, under the device of its tensor arguments: the
    one place every backend launches from."""
    with device_guard(tensor_device(args, kwargs)):
        torch.library.wrap_triton(kernel)[grid](*args, **kwargs)


def kernel_op(name: str, fn: Callable[..., Any], fake: Callable[..., Any], mutates_args: Iterable[str] = ()) -> Any:
    """The custom op ``polymixer::<name>`` running ``fn`` (whose launches go through :func:`launch`), with ``fake``
    its fake implementation under the interpreter (the module doc's **Custom ops**)."""
    qualname = f"polymixer::{name}"
    if interpreted():
        op = torch.library.custom_op(qualname, fn, mutates_args=tuple(mutates_args))
        op.register_fake(fake)
    else:
        op = torch.library.triton_op(qualname, fn, mutates_args=tuple(mutates_args))
    return op


_SM: Dict[Any, int] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (132 on an H100 SXM); 132 for the interpreter, so that tests
    choose the launches a GPU would."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return 132
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SM:
        _SM[key] = torch.cuda.get_device_properties(key).multi_processor_count
    return _SM[key]


# ----------------------------------------------------------------------------------------------------------------
# the first-use check
# ----------------------------------------------------------------------------------------------------------------

# (op, device type, device index, dtype) → None (the kernels agree with the torch form) or why not
CHECKED: Dict[Tuple[str, str, Optional[int], torch.dtype], Optional[str]] = {}


def run_in_fresh_thread(fn: Callable[[], None], device: Optional[torch.device] = None) -> None:
    """Run ``fn()`` in a new thread, under ``device``'s guard (a fresh thread starts on CUDA device 0, whichever device
    the caller's thread had made current), and re-raise what it raised: a context in which a small forward + backward
    cannot fail because of the caller's. torch's dispatch modes (torch.export's proxy and fake modes,
    functionalization), grad mode, inference mode and autocast are thread-local, so ``fn`` runs with gradients on, no
    inference mode, no autocast and real tensors, whatever trace the caller is in (with torch 2.11, torch.export's
    tracer refused the check's ``torch.Generator``)."""
    raised: list = []

    def target() -> None:
        try:
            with device_guard(device):
                fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            raised.append(e)

    thread = threading.Thread(target=target, name="polymixer-first-use-check")
    thread.start()
    thread.join()
    if raised:
        raise raised[0]


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def check_runs(name: str, dtype: torch.dtype) -> Tuple[Tuple[str, torch.dtype], ...]:
    """The (backend, dtype) runs of a first-use check: the kernels in ``dtype``, the torch form in float32, and in a
    low-precision ``dtype`` the torch form in it too (:func:`judge_check` measures its own rounding)."""
    runs = ((name, dtype), ("torch", torch.float32))
    return runs + ((("torch", dtype),) if dtype != torch.float32 else ())


def judge_check(outs: list, dtype: torch.dtype, what: Any, floor: float = 0.0) -> None:
    """Raise when the kernels' outputs (``outs[0]``) differ from the float32 torch form's (``outs[1]``) by more than
    allowed (max error ÷ max value): fp32 1e-3 (tf32 products on a GPU), bf16 / fp16 3e-2 (a few roundings of 8- or
    11-bit mantissas), at least ``floor``, and in bf16 / fp16 at least twice the torch form's own difference in that
    dtype (its outputs ``outs[2]``): the kernels may round no worse than the torch form does, whatever the inputs'
    scale (a gradient through several bf16 products can differ by more than 3e-2 in either form)."""
    worst = check_results(outs[0], outs[1])
    allowed = max(1e-3 if dtype == torch.float32 else 3e-2, floor)
    if dtype != torch.float32 and len(outs) > 2:
        allowed = max(allowed, 2.0 * check_results(outs[2], outs[1]))
    if not worst <= allowed:
        raise AssertionError(f"{what}: relative difference {worst:.2e} > {allowed:.1e}")


def check_results(got: Iterable[torch.Tensor], want: Iterable[torch.Tensor]) -> float:
    """The worst relative difference (max error ÷ max value) over pairs of tensors, in float64."""
    worst = 0.0
    for a, b in zip(got, want):
        b64 = b.detach().double()
        err = float((a.detach().double() - b64).abs().max() / b64.abs().max().clamp_min(1e-30))
        worst = max(worst, err if err == err else float("inf"))
    return worst


def _run_check(op: str, device_type: str, device_index: Optional[int], dtype: torch.dtype,
               check: Callable[[torch.device, torch.dtype], None]) -> Optional[str]:
    key = (op, device_type, device_index, dtype)
    if key in CHECKED:
        return CHECKED[key]
    device = torch.device(device_type, device_index) if device_index is not None else torch.device(device_type)
    if _capturing(device):  # never run a check inside a CUDA graph; the caller decides (not cached)
        return "not yet checked on this device (a CUDA graph is being captured)"
    CHECKED[key] = None  # while checking, the kernels are taken (the check calls them)
    try:
        run_in_fresh_thread(lambda: check(device, dtype), device)
    except Exception as e:  # a failed launch or a wrong result: loud, once
        CHECKED[key] = (f"the kernels failed their first-use check on {device} in {str(dtype).replace('torch.', '')}: "
                        f"{type(e).__name__}: {e}")
        warnings.warn(f"polymixer: {CHECKED[key]}; {op} runs on the torch form", RuntimeWarning, stacklevel=3)
    return CHECKED[key]


# dynamo runs the check eagerly while it traces and keeps its answer as a constant of the graph
_traced_check = torch._dynamo.assume_constant_result(_run_check)


def first_use(op: str, device: torch.device, dtype: torch.dtype,
              check: Callable[[torch.device, torch.dtype], None]) -> Optional[str]:
    """None when ``op``'s kernels passed their check on ``device`` in float32 and in ``dtype`` (run once per process,
    the first time a call needs it), else the reason they did not. ``check(device, dtype)`` raises on a mismatch."""
    run = _traced_check if torch.compiler.is_compiling() else _run_check
    for dt in dict.fromkeys((torch.float32, dtype)):
        why = run(op, device.type, device.index, dt, check)
        if why is not None:
            return why
    return None
