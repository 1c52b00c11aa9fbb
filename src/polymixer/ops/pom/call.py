"""PoM's weights and its call: :class:`PomWeights` (one object, built by the layer: ``PoM.weights``) and
:func:`make_pom_call`, which validates a call of :func:`polymixer.ops.pom.pom` once into the
:class:`~polymixer.ops.call.Call` its backends receive."""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

from torch import Tensor

from ..call import Call, PoMState, check_weights, make_call
from ..common import check_reference_gate

__all__ = ["PomWeights", "make_pom_call"]


class PomWeights(NamedTuple):
    """PoM's weights, as the layer holds them (the reference implementation's layout)."""

    in_weight: Tensor  # (D + Ds, d): W_h stacked over W_s (self-mixing does one matrix product for both)
    gate_bias: Tensor  # (Ds,): Ds = D (a gate per channel) or a divisor of D (one per head)
    coeff: Tensor  # (D, k): column p − 1 multiplies the p-th power
    out_weight: Tensor  # (d, D): W_o
    out_bias: Optional[Tensor] = None  # (d,)
    shift_weight: Optional[Tensor] = None  # (W, D): a causal depthwise convolution of W_h c over the current and
    # W − 1 previous context tokens (the value PoM's token shift, on h), or None (no shift)


def make_pom_call(x: Tensor, weights: PomWeights, context: Optional[Tensor], modes: Dict[str, Any],
                  state: Optional[PoMState] = None) -> Call:
    """Validate a call of :func:`~polymixer.ops.pom.pom` (the weights' type and layout, then
    :func:`~polymixer.ops.call.make_call`, then a stream's (B, D) sum and its shift's memory) and build its call."""
    check_weights("pom", weights, PomWeights)
    D = weights.coeff.shape[0]
    Ds = weights.in_weight.shape[0] - D
    if Ds <= 0 or D % Ds != 0:
        raise ValueError(f"in_weight of shape {tuple(weights.in_weight.shape)} does not stack W_h ({D} rows) over W_s")
    if tuple(weights.gate_bias.shape) != (Ds,):
        raise ValueError(f"gate_bias has shape {tuple(weights.gate_bias.shape)}, in_weight a gate of {Ds} rows")
    shift = weights.shift_weight
    if shift is not None and (shift.dim() != 2 or shift.shape[1] != D or shift.shape[0] < 1):
        raise ValueError(f"shift_weight has shape {tuple(shift.shape)}, expected (W, D = {D})")
    call = make_call("pom", x, context, weights, modes, state)
    if call.rope_convention == "reference":
        check_reference_gate(call.rope, D, Ds)
    if state is not None and tuple(state.sum.shape) != (call.B, D):
        raise ValueError(f"state holds batch {state.sum.shape[0]} × {state.sum.shape[-1]} features but x has batch "
                         f"{call.B} and the mixer has D={D}; index or re-initialise the state")
    kept = None if state is None or state.prev is None else tuple(state.prev.shape)
    needs = None if shift is None else (call.B, max(shift.shape[0] - 1, 1), D)
    if state is not None and kept != needs:
        raise ValueError(f"state keeps the last projections {kept}, this PoM's token shift needs {needs}: "
                         f"re-initialise the state with this PoM's init_state")
    return call
