"""The value-carrying PoM's weights and its call: :class:`ValuePomWeights` (one object, built by the layer:
``ValuePoM.weights``) and :func:`make_value_call`, which validates a call of
:func:`polymixer.ops.value_pom.value_pom` once into the :class:`~polymixer.ops.call.Call` its backends receive (the
gated form's front end, :mod:`polymixer.ops.gated_value_pom`, adds its own checks to it)."""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional, Tuple

from torch import Tensor

from ..call import Call, PoMState, check_weights, make_call
from ..features import CHUNK

__all__ = ["ValuePomWeights", "make_value_call", "check_layout"]


class ValuePomWeights(NamedTuple):
    """The value-carrying PoM's weights, as the layer holds them."""

    in_weight: Tensor  # (2D + dv + Ds, d): W_k over W_v over W_q over W_s (self-mixing: one matrix product)
    gate_bias: Tensor  # (Ds,): Ds = dv (a gate per channel) or a divisor of dv (one per head)
    coeff: Tensor  # (D, k): the keys' polynomial coefficients
    coeff_q: Tensor  # (D, k): the queries'
    shift_weight: Optional[Tensor]  # (W, D + dv): the current and W − 1 previous tokens' weights in the key / value
    # projections (a causal depthwise convolution; W = 2: the token shift), or None (no token shift)
    norm_weight: Tensor  # (dv,): gain of the per-head RMSNorm of the readout
    out_weight: Tensor  # (d, dv): W_o
    out_bias: Optional[Tensor] = None  # (d,)


def check_layout(weights: Any, heads: int) -> Tuple[int, int]:
    """(D, dv) of weights that stack W_k, W_v, W_q and W_s and split into ``heads`` heads, else a ValueError."""
    in_weight, coeff, coeff_q = weights.in_weight, weights.coeff, weights.coeff_q
    D, dv = coeff.shape[0], weights.out_weight.shape[1]
    Ds = in_weight.shape[0] - 2 * D - dv
    if coeff_q.shape != coeff.shape:
        raise ValueError(f"coeff_q has shape {tuple(coeff_q.shape)}, coeff {tuple(coeff.shape)}: they must match")
    if Ds <= 0 or dv % Ds != 0:
        raise ValueError(f"in_weight of shape {tuple(in_weight.shape)} does not stack W_k ({D}), W_v ({dv}), "
                         f"W_q ({D}) and a gate whose width divides {dv}")
    if tuple(weights.gate_bias.shape) != (Ds,):
        raise ValueError(f"gate_bias has shape {tuple(weights.gate_bias.shape)}, in_weight a gate of {Ds} rows")
    if D % heads or dv % heads:
        raise ValueError(f"heads = {heads} must divide D = {D} and value_dim = {dv}")
    return D, dv


def make_value_call(x: Tensor, weights: Any, context: Optional[Tensor], modes: Dict[str, Any],
                    state: Optional[PoMState] = None, heads: int = 1, chunk: int = CHUNK,
                    op: str = "value_pom", kind: type = ValuePomWeights) -> Call:
    """Validate a call of ``op`` (the value PoM's, or its gated form's with ``kind`` its weights type) once: the
    weights' type and layout, :func:`~polymixer.ops.call.make_call`, the rotary width per head, the chunk, and a
    stream's state; ValueError / TypeError with the one-line reason otherwise."""
    check_weights(op, weights, kind)
    D, dv = check_layout(weights, heads)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    call = make_call(op, x, context, weights, modes, state, heads=heads, chunk=chunk)
    if call.rope_convention != "relative":
        raise ValueError(f"{op} has one rotary convention, 'relative' (rope_convention='reference' is the reference "
                         f"implementation's PoMRoPE: a plain PoM)")
    Dh = D // heads
    if (call.rope == "1d" and Dh % 2) or (call.rope == "2d" and Dh % 4):
        raise ValueError(f"{call.rope} rotary needs a key width per head (D/heads = {Dh}) divisible by "
                         f"{2 if call.rope == '1d' else 4}")
    if state is not None:
        if state.prev is None:
            raise ValueError("this state belongs to a plain PoM; the value-carrying PoM needs its own init_state")
        if tuple(state.sum.shape) != (call.B, heads, Dh, dv // heads):
            raise ValueError(f"state has shape {tuple(state.sum.shape)} but x has batch {call.B} and the mixer keeps "
                             f"{(call.B, heads, Dh, dv // heads)}; index or re-initialise the state")
    return call
