"""What every operation of polymixer shares: the non-linearities (forward and closed-form derivative), input checks,
packed-sequence offsets (FlashAttention's ``cu_seqlens``) and rotary positions.

Everything here is public within :mod:`polymixer.ops` (and re-exported by :mod:`polymixer.functional`): a backend of
an op imports what it needs from here, never another backend's private helper.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

ActivationLike = Union[str, Callable[[Tensor], Tensor]]
CuSeqlens = Union[Tensor, Tuple[Tensor, Tensor]]

__all__ = ["ActivationLike", "CuSeqlens", "MIXING_MODES", "STEP_MODES", "REFERENCE_MODES", "LAYER_MODES", "layer_modes",
           "check_mode_keywords", "ACTIVATIONS", "GATES", "GATES_INPLACE", "FUSED_BACKWARD", "resolve", "activation",
           "gate_fn", "compute_dtype", "operand_dtype", "elementwise_backward", "is_compiling", "cast_output",
           "check_cu_seqlens", "segments", "documents_cu_seqlens", "rope_angles", "rotate", "check_tokens",
           "check_bool_mask", "check_positions", "default_positions", "batch_packed", "check_mix_inputs",
           "packed_local_positions", "triton_precheck", "triton_possible", "ROPE_BASE", "check_reference_gate",
           "Mixing"]

# ----------------------------------------------------------------------------------------------------------------
# Elementwise non-linearities: forward and closed-form derivative, so that custom backwards can recompute cheaply.
# ----------------------------------------------------------------------------------------------------------------

_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _leaky_clamp(x: Tensor) -> Tensor:
    # clamping the fresh leaky_relu output in place is autograd-safe: leaky_relu's backward reads its input
    return F.leaky_relu(x, 0.01).clamp_(-0.1, 6.0)


def _leaky_clamp_grad(x: Tensor) -> Tensor:
    # leaky_relu(x) lies in [-0.1, 6] exactly when -10 <= x <= 6 (PyTorch's clamp passes gradients at the bounds)
    slope = torch.where(x > 0, 1.0, 0.01).to(x.dtype)
    return slope.mul_(((x >= -10.0) & (x <= 6.0)).to(x.dtype))


def _gelu_grad(x: Tensor) -> Tensor:
    cdf = 0.5 * (1.0 + torch.erf(x / _SQRT_2))
    return cdf + x * torch.exp(-0.5 * x * x) * _INV_SQRT_2PI


def _silu_grad(x: Tensor) -> Tensor:
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


ACTIVATIONS: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]] = {
    # the reference implementation's default: leaky ReLU (slope 0.01) clamped to [-0.1, 6]
    "leaky_clamp": (_leaky_clamp, _leaky_clamp_grad),
    "relu": (F.relu, lambda x: (x > 0).to(x.dtype)),
    "gelu": (F.gelu, _gelu_grad),
    "silu": (F.silu, _silu_grad),
    "tanh": (torch.tanh, lambda x: 1.0 - torch.tanh(x) ** 2),
    "identity": (lambda x: x, torch.ones_like),
}

GATES: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]] = {
    # the reference implementation's default
    "hardsigmoid": (F.hardsigmoid, lambda u: ((u > -3.0) & (u < 3.0)).to(u.dtype) / 6.0),
    # the paper's σ
    "sigmoid": (torch.sigmoid, lambda u: torch.sigmoid(u) * (1.0 - torch.sigmoid(u))),
    # no selection at all (ablation)
    "identity": (lambda u: u, torch.ones_like),
}


# in-place forms used on fresh buffers inside the fused functions
GATES_INPLACE: dict[str, Callable[[Tensor], Tensor]] = {
    "hardsigmoid": lambda u: F.hardsigmoid(u, inplace=True),
    "sigmoid": torch.sigmoid_,
    "identity": lambda u: u,
}


def resolve(table: dict, name: ActivationLike, what: str):
    if callable(name) and not isinstance(name, str):
        return name, None
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown {what} {name!r}; expected one of {sorted(table)} or a callable")
    return table[name]


def activation(x: Tensor, name: ActivationLike = "leaky_clamp") -> Tensor:
    """Apply the polynomial activation ``act`` by name (or a callable)."""
    fn, _ = resolve(ACTIVATIONS, name, "activation")
    return fn(x)


def gate_fn(u: Tensor, name: ActivationLike = "hardsigmoid") -> Tensor:
    """Apply the selection gate by name (or a callable)."""
    fn, _ = resolve(GATES, name, "gate")
    return fn(u)


def cast_output(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype`` for an autograd.Function's forward to return: ``t`` itself when it has that dtype already.

    Under torch.compile, torch 2.11's dynamo silently returns zero for every gradient of an autograd.Function whose
    forward returns an alias of an intermediate (``t.to(t.dtype)``) or a tensor it changed in place (``acc.mul_(h)``);
    torch 2.13 does not. Forwards here therefore return fresh, untouched tensors while compiling."""
    return t if t.dtype == dtype else t.to(dtype)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: at least fp32 (bf16/fp16 inputs are mixed in fp32, fp64 stays fp64)."""
    return torch.promote_types(dtype, torch.float32)


def operand_dtype(x: Tensor) -> torch.dtype:
    """The dtype a call's projections hand its kernels: autocast's when it is on for ``x``'s device, else ``x``'s
    (features computed in fp32 are cast back to it, so that a bf16 layer's products run on bf16 tensor cores)."""
    dev = x.device.type
    if dev in ("cuda", "cpu") and torch.is_autocast_enabled(dev):  # (meta tensors have no autocast)
        return torch.get_autocast_dtype(dev)
    return x.dtype


def _leaky_clamp_backward(x: Tensor, grad: Tensor) -> Tensor:
    # two fused ATen kernels instead of five masks (≈ 10× faster on CPU); at the exact bounds x = −10 and x = 6 the
    # gradient is 0 here where the masks passed it: both are subgradients at a kink
    return torch.ops.aten.hardtanh_backward(torch.ops.aten.leaky_relu_backward(grad, x, 0.01, False), x, -10.0, 6.0)


# fused backward kernels, keyed by the forward function: grad_in = bwd(u, grad_out)
FUSED_BACKWARD: dict = {_leaky_clamp: _leaky_clamp_backward,
                         F.hardsigmoid: lambda u, g: torch.ops.aten.hardsigmoid_backward(g, u)}


def elementwise_backward(fn, grad_fn, u: Tensor, grad_out: Tensor) -> Tensor:
    """d(fn)/du · grad_out: by a fused kernel or a closed form when known, else by autograd on a recomputation."""
    fused = FUSED_BACKWARD.get(fn)
    if fused is not None:
        return fused(u, grad_out.to(u.dtype))
    if grad_fn is not None:
        return grad_out * grad_fn(u)
    with torch.enable_grad():
        leaf = u.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(leaf), leaf, grad_out)
    return g


# ----------------------------------------------------------------------------------------------------------------
# Packed sequences
# ----------------------------------------------------------------------------------------------------------------


def is_compiling() -> bool:
    return torch.compiler.is_compiling()


def check_cu_seqlens(cu_seqlens: Tensor, total: int, name: str = "cu_seqlens") -> None:
    """Validate FlashAttention-style offsets: 1-D integer, starts at 0, strictly increasing, ends at ``total``.

    Value checks need the data, so they run in eager mode on CPU tensors only: under ``torch.compile`` and on a GPU
    only shapes and dtypes are checked (reading the offsets back at every layer would stall the GPU).
    """
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError(f"{name} must be a tensor of int32 offsets, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 (or int64) offsets, got dtype {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name} must be 1-D with at least 2 offsets, got shape {tuple(cu_seqlens.shape)}")
    if is_compiling() or cu_seqlens.device.type != "cpu":
        return
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {cu[0]}")
    if cu[-1] != total:
        raise ValueError(f"{name} must end at the number of tokens {total}, got {cu[-1]}")
    bad = [i for i in range(len(cu) - 1) if cu[i + 1] <= cu[i]]
    if bad:
        i = bad[0]
        raise ValueError(
            f"{name} must be strictly increasing (no empty sequence), but offsets {i} and {i + 1} are "
            f"{cu[i]} and {cu[i + 1]}"
        )


def segments(cu: Tensor, total: int) -> Tuple[Tensor, Tensor, Tensor]:
    """(segment id per token, start offset per token, starts per segment) for packed offsets."""
    cu = cu.to(torch.int64)
    idx = torch.arange(total, device=cu.device)
    seg = torch.bucketize(idx, cu[1:], right=True)
    starts = cu[:-1]
    return seg, starts[seg], starts


def documents_cu_seqlens(idx: Tensor, sep_token: int) -> Tuple[Tensor, Tensor]:
    """Pack a (B, T) batch of token windows into one sequence of documents.

    Documents end after every ``sep_token`` (end-of-text) and at every row end. Returns (cu_seqlens int32 (S+1,),
    positions (B·T,) — the index of each token inside its document) for a forward on ``idx.reshape(1, -1)``.
    """
    B, T = idx.shape
    flat = idx.reshape(-1)
    ends = flat == sep_token
    ends[T - 1::T] = True
    stops = torch.nonzero(ends).squeeze(1) + 1
    cu = torch.cat([torch.zeros(1, dtype=torch.long, device=idx.device), stops])
    starts = torch.repeat_interleave(cu[:-1], cu[1:] - cu[:-1])
    return cu.to(torch.int32), torch.arange(B * T, device=idx.device) - starts


# ----------------------------------------------------------------------------------------------------------------
# The mode of a call: one object for the keywords every op shares
# ----------------------------------------------------------------------------------------------------------------

ROPE_BASE = 10000.0  # the rotary frequency base of every op (RoFormer's, the language models' default)


@dataclass(frozen=True, eq=False)
class Mixing:
    """The mode keywords every mixing op shares (``pom``, ``value_pom``, ``gated_value_pom`` and the float64 oracles),
    as the user passed them: which context tokens each query sees (``causal``,
    ``block_size``, ``mask`` (B, N) key padding or (B, M, N) general, ``cu_seqlens`` packed offsets), where tokens sit
    for rotary positions (``positions``, ``context_positions``, ``rope`` None / "1d" / "2d", ``rope_base``,
    ``rope_convention`` "relative" / "reference": docs/mixer.md) and how
    features are made and read (``activation``, ``gate``, ``reduction`` "mean" / "sum").

    Each public function keeps these as keywords (a drop-in API), builds one ``Mixing`` at its top and hands it down,
    so the defaults live here once. A stream (an op called with a state) uses the same object (``block_size``,
    ``cu_seqlens`` and ``context_positions`` stay None: :data:`STEP_MODES`)."""

    causal: bool = False
    block_size: Optional[int] = None
    mask: Optional[Tensor] = None
    cu_seqlens: Optional[CuSeqlens] = None
    positions: Optional[Tensor] = None
    context_positions: Optional[Tensor] = None
    activation: ActivationLike = "leaky_clamp"
    gate: ActivationLike = "hardsigmoid"
    reduction: str = "mean"
    rope: Optional[str] = None
    rope_base: float = ROPE_BASE
    rope_convention: str = "relative"

    @classmethod
    def of(cls, op: str, modes: Dict[str, Any], only: Optional[Tuple[str, ...]] = None) -> "Mixing":
        """The Mixing of a public op's mode keywords: ``modes`` as the caller passed them (``**modes`` of ``op``);
        ``only`` limits them (an oracle reads no masks). A keyword that is not a mode of ``op`` is a TypeError naming
        it and the op's modes, as a misspelt keyword argument would be."""
        check_mode_keywords(op, modes, only if only is not None else MIXING_MODES)
        out = dict(modes)
        if "rope_base" in out:
            out["rope_base"] = float(out["rope_base"])
        return cls(**out)

    @property
    def two_d(self) -> bool:
        """Whether positions are (row, col) pairs (2-D rotary)."""
        return self.rope == "2d"

    def check(self) -> None:
        """Refuse a rotary kind, reduction, activation or gate that no op knows (ValueError naming it); the masks
        and offsets are checked against the tensors by :func:`check_mix_inputs`."""
        if self.rope not in (None, "1d", "2d"):
            raise ValueError(f"rope must be None, '1d' or '2d', got {self.rope!r}")
        if self.rope_convention not in ("relative", "reference"):
            raise ValueError(f"rope_convention must be 'relative' or 'reference', got {self.rope_convention!r}")
        if self.reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {self.reduction!r}")
        resolve(ACTIVATIONS, self.activation, "activation")
        resolve(GATES, self.gate, "gate")

    def with_(self, **changes: Any) -> "Mixing":
        """A copy with ``changes`` (e.g. the masks and positions of packed sequences laid out one row each)."""
        return replace(self, **changes)


MIXING_MODES = tuple(f.name for f in fields(Mixing))  # every mode keyword (a constant: torch.compile reads it)
# the modes of a stream (an op called with a state: its chunk causal or one block; no packing, no cross-mixing)
STEP_MODES = ("causal", "mask", "positions", "activation", "gate", "reduction", "rope", "rope_base",
              "rope_convention")
# the modes a layer's forward takes (the rest of Mixing is the layer's own configuration)
LAYER_MODES = ("mask", "causal", "block_size", "cu_seqlens", "positions", "context_positions")


def layer_modes(layer: object, modes: Dict[str, Any]) -> Tuple[Any, ...]:
    """``layer``'s forward mode keywords (``**modes``: :data:`LAYER_MODES`) in that order, None where not given — so
    no layer spells them out again; any other keyword is the TypeError a misspelt keyword argument would be."""
    if not all(k in LAYER_MODES for k in modes):  # the layer's name is only spelt out for the error
        check_mode_keywords(f"{type(layer).__name__}.forward", modes, LAYER_MODES)
    return tuple(modes.get(k) for k in LAYER_MODES)


def check_mode_keywords(op: str, modes: Dict[str, Any], allowed: Sequence[str]) -> None:
    """A keyword of ``**modes`` that ``op`` does not take is the TypeError a misspelt keyword argument would be,
    naming it and the op's mode keywords."""
    bad = [k for k in modes if k not in allowed]
    if bad:
        raise TypeError(f"{op}() got an unexpected keyword argument {bad[0]!r}; its mode keywords: "
                        f"{', '.join(allowed)}")


# the modes a float64 oracle reads (which tokens a query sees comes to it as an explicit visibility matrix)
REFERENCE_MODES = ("activation", "gate", "reduction", "rope", "rope_base", "rope_convention", "positions",
                   "context_positions")


# ----------------------------------------------------------------------------------------------------------------
# Rotary positions
# ----------------------------------------------------------------------------------------------------------------


def rope_angles(
    positions: Tensor, dim: int, base: float = ROPE_BASE, two_d: bool = False, dtype: torch.dtype = torch.float32
) -> Tuple[Tensor, Tensor]:
    """cos / sin of the rotation angles for ``dim`` channels paired (k, k + dim/2).

    Args:
        positions: (..., N) for 1-D rotary, or (..., N, 2) (row, col) with ``two_d=True``, where the first dim/4
            pairs turn with the row and the last dim/4 with the column. Integer or fractional.
    Returns:
        cos, sin of shape (..., N, dim/2) in ``dtype`` (angles are reduced modulo 2π in fp64 first, so fp32 tables
        stay exact at long range).
    """
    pos = positions.to(torch.float64)
    if two_d and dim % 4 != 0:
        raise ValueError(f"2-D rotary positions need a width divisible by 4, got {dim}")
    if dim % 2 != 0:
        raise ValueError(f"1-D rotary positions need an even width, got {dim}")
    pairs = dim // 4 if two_d else dim // 2  # per position axis
    inv = base ** (-torch.arange(pairs, dtype=torch.float64, device=pos.device) / pairs)
    ang = torch.cat([pos[..., 0:1] * inv, pos[..., 1:2] * inv], dim=-1) if two_d else pos.unsqueeze(-1) * inv
    ang = torch.remainder(ang, 2.0 * math.pi).to(dtype)
    return ang.cos(), ang.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool = False, halves: bool = False) -> Tensor:
    """Rotate channel pairs (k, k + D/2) of ``x`` (…, D) by the angles whose cos/sin are given (…, D/2).

    ``halves``: 2-D tables (the row's angles, then the column's) turn pairs (k, k + D/4) within each half of ``x``
    instead, the first half by the row, as the reference implementation's PoMRoPE does."""
    if halves:
        q = (2, x.shape[-1] // 4)
        return rotate(x.unflatten(-1, (2, -1)), cos.unflatten(-1, q), sin.unflatten(-1, q), inverse).flatten(-2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    if inverse:
        sin = -sin
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def check_reference_gate(rope: Optional[str], D: int, Ds: int) -> None:
    """PoMRoPE's assertions on a gate of ``Ds`` heads over D channels (a gate per channel, Ds = D, always passes)."""
    if rope is not None and Ds != D and (Ds % 2 if rope == "1d" else Ds % 4 or D // Ds < 4):
        raise ValueError(f"rope_convention='reference' turns the gate's heads in pairs: sel_heads must be even (1-D) "
                         f"or divisible by 4 with heads of ≥ 4 channels (2-D), got {rope} and {Ds} heads over {D}")


# ----------------------------------------------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------------------------------------------


def check_tokens(x: Tensor, dim: int, name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() != 3:
        raise ValueError(f"{name} must have shape (batch, tokens, {dim}), got rank {x.dim()} shape {tuple(x.shape)}")
    if x.shape[-1] != dim:
        raise ValueError(f"{name} has {x.shape[-1]} features but the mixer was built for dim={dim}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} is an empty sequence (shape {tuple(x.shape)}); at least one token is needed")


def check_bool_mask(mask: Tensor, shapes: Sequence[Tuple[int, ...]], what: str) -> None:
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a bool tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = the token takes part), got dtype {mask.dtype}")
    if tuple(mask.shape) not in [tuple(s) for s in shapes]:
        expected = " or ".join(str(tuple(s)) for s in shapes)
        raise ValueError(f"mask for {what} must have shape {expected}, got {tuple(mask.shape)}")


def check_positions(pos: Tensor, B: int, N: int, two_d: bool, name: str) -> None:
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(pos).__name__}")
    tail = (N, 2) if two_d else (N,)
    ok = tuple(pos.shape) in (tail, (B,) + tail)
    if not ok:
        raise ValueError(
            f"{name} must have shape {tail} or {(B,) + tail} for {'2-D' if two_d else '1-D'} rotary, "
            f"got {tuple(pos.shape)}"
        )


def default_positions(n: int, device: torch.device, two_d: bool, name: str) -> Tensor:
    if two_d:
        raise ValueError(f"2-D rotary needs explicit {name} of shape (N, 2) holding (row, col)")
    return torch.arange(n, device=device)


def batch_packed(x: Tensor, context: Optional[Tensor], cu_seqlens: Optional[CuSeqlens]
                 ) -> Tuple[Tensor, Optional[Tensor], bool]:
    """Packed tokens may come as (T, d): give them the batch dimension of one; the flag says to take it off again."""
    if cu_seqlens is None or not isinstance(x, Tensor) or x.dim() != 2:
        return x, context, False
    context = context.unsqueeze(0) if isinstance(context, Tensor) and context.dim() == 2 else context
    return x.unsqueeze(0), context, True


def check_mix_inputs(
    x: Tensor,
    context: Optional[Tensor],
    dim: int,
    mask: Optional[Tensor],
    causal: bool,
    block_size: Optional[int],
    cu_seqlens: Optional[CuSeqlens],
) -> Tuple[int, int, int, Optional[Tensor], Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """Validate a mixer call (shared by PoM and the attention baseline, so both reject the same inputs alike).

    Returns (B, M, N, key_mask (B, N) or None, general mask (B, M, N) or None, cu_seqlens_q or None,
    cu_seqlens_k or None); for packed self-mixing cu_seqlens_q is None and cu_seqlens_k holds the offsets.
    """
    check_tokens(x, dim, "x")
    if context is not None:
        check_tokens(context, dim, "context")
        if context.shape[0] != x.shape[0]:
            raise ValueError(f"context batch {context.shape[0]} does not match x batch {x.shape[0]}")
    B, M, _ = x.shape
    N = M if context is None else context.shape[1]
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if block_size is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, int):
            raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive number of tokens, got {block_size}")
        if not causal:
            raise ValueError("block_size requires causal=True (block-causal masking)")
    key_mask = general = None
    if mask is not None:
        check_bool_mask(mask, [(B, N), (B, M, N)], f"batch {B}, {M} queries, {N} context tokens")
        key_mask, general = (mask, None) if mask.dim() == 2 else (None, mask)
    cu_q = cu_k = None
    if cu_seqlens is not None:
        if isinstance(cu_seqlens, (tuple, list)):
            if len(cu_seqlens) != 2:
                raise ValueError("cu_seqlens for cross-mixing must be a pair (cu_seqlens_q, cu_seqlens_k)")
            cu_q, cu_k = cu_seqlens
            check_cu_seqlens(cu_q, M, "cu_seqlens_q")
            check_cu_seqlens(cu_k, N, "cu_seqlens_k")
            if cu_q.numel() != cu_k.numel():
                raise ValueError(
                    f"cu_seqlens_q holds {cu_q.numel() - 1} sequences but cu_seqlens_k holds {cu_k.numel() - 1}"
                )
        else:
            if context is not None:
                raise ValueError("packed cross-mixing needs cu_seqlens=(cu_seqlens_q, cu_seqlens_k)")
            check_cu_seqlens(cu_seqlens, N)
            cu_k = cu_seqlens
        if B != 1:
            raise ValueError(f"packed sequences (cu_seqlens) need batch size 1, got {B}")
        if general is not None:
            raise ValueError("a (B, M, N) mask and cu_seqlens cannot be combined")
    return B, M, N, key_mask, general, cu_q, cu_k


def triton_possible() -> bool:
    """Whether Triton kernels could run in this process (a CUDA device, or the interpreter) and Triton is
    installed: then the Triton backends are imported with the ops, so that ``torch.compile`` can choose them."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return False
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or torch.cuda.is_available()


def triton_precheck(call: Any, explicit: bool = False) -> Optional[str]:
    """Whether a call's tensors could run Triton kernels: CUDA tensors; CPU tensors too under TRITON_INTERPRET=1, but
    only when ``backend("triton")`` asks (the interpreter is for tests: the automatic choice never takes it). Checked
    before the Triton backends are imported, so CPU calls never import Triton."""
    x = call.x
    if x.device.type == "cuda":
        return None
    if explicit and x.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return None
    return f"CUDA tensors only (got {x.device.type}; CPU tensors run the kernels under TRITON_INTERPRET=1 with " \
           f"backend('triton'))"


def packed_local_positions(cu: Optional[Tensor], n: int, device: torch.device, two_d: bool, name: str) -> Tensor:
    """Default rotary positions: each token's index in its sequence (in the whole batch row without packing)."""
    pos = default_positions(n, device, two_d, name)
    if cu is None:
        return pos
    _, start, _ = segments(cu, n)
    return pos - start
