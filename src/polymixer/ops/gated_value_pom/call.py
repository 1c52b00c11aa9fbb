"""The gated value PoM's weights and its call: :class:`GatedValuePomWeights` (one object, built by the layer:
``GatedValuePoM.weights``), :func:`retnet_bias` (their decay's initial bias) and :func:`make_gated_call`, which
validates a call of :func:`polymixer.ops.gated_value_pom.gated_value_pom` once — the value PoM's checks
(:func:`polymixer.ops.value_pom.call.make_value_call`), then its own."""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

import torch
from torch import Tensor

from ..call import Call, PoMState
from ..features import CHUNK
from ..value_pom.call import make_value_call

__all__ = ["GatedValuePomWeights", "make_gated_call", "retnet_bias"]


class GatedValuePomWeights(NamedTuple):
    """The gated value PoM's weights: the value PoM's (:class:`~polymixer.ops.value_pom.ValuePomWeights`, the same
    names and shapes) and the decay's."""

    in_weight: Tensor  # (2D + dv + Ds, d): W_k over W_v over W_q over W_s
    gate_bias: Tensor  # (Ds,)
    coeff: Tensor  # (D, k): the keys' polynomial coefficients
    coeff_q: Tensor  # (D, k): the queries'
    shift_weight: Optional[Tensor]  # (W, D + dv): the token shift of width W, or None
    norm_weight: Tensor  # (dv,): gain of the per-head RMSNorm of the readout
    out_weight: Tensor  # (d, dv): W_o
    out_bias: Optional[Tensor]  # (d,) or None
    decay_weight: Tensor  # (H, d): one log-decay per head and token, g = −softplus(decay_weight · x + decay_bias)
    decay_bias: Tensor  # (H,)


def retnet_bias(heads: int) -> Tensor:
    """Decay biases whose initial per-head decay is RetNet's γ_h = 1 − 2^(−5−h): softplus(b_h) = −log γ_h."""
    gamma = 1.0 - 2.0 ** (-5.0 - torch.arange(heads, dtype=torch.float64))
    return torch.log(torch.expm1(-torch.log(gamma))).float()


def make_gated_call(x: Tensor, weights: GatedValuePomWeights, context: Optional[Tensor], modes: Dict[str, Any],
                    state: Optional[PoMState] = None, heads: int = 1, chunk: int = CHUNK) -> Call:
    """Validate a call of the gated value PoM once: self-mixing only (a decay needs the tokens' order), the value
    PoM's checks, the decay's shapes, no explicit (B, M, N) mask, and a stream causal only."""
    if context is not None or modes.get("context_positions") is not None:
        raise ValueError("the gated value PoM mixes a sequence with itself: its decay needs the tokens' order "
                         "(cross-mixing is not supported)")
    call = make_value_call(x, weights, None, modes, state, heads, chunk, "gated_value_pom", GatedValuePomWeights)
    d = weights.out_weight.shape[0]
    if weights.decay_weight.shape != (heads, d) or weights.decay_bias.shape != (heads,):
        raise ValueError(f"decay_weight must be ({heads}, {d}) and decay_bias ({heads},), got "
                         f"{tuple(weights.decay_weight.shape)} and {tuple(weights.decay_bias.shape)}")
    if call.mask is not None:
        raise ValueError("the gated value PoM takes key padding, causal, block-causal and packed masking; an "
                         "explicit (B, M, N) mask is not supported")
    if state is not None and not call.causal:
        raise ValueError("the gated value PoM streams causally (a block would need its later tokens)")
    return call
