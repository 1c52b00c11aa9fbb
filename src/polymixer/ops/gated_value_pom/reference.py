"""The ``reference`` backend of the gated value PoM: the float64 oracle
(:func:`polymixer.ops.gated_value_pom.modular.reference_gated`, explicit decay weights exp(−|Λ_i − Λ_j|)). O(N²):
for tests and checks, never chosen automatically; packed sequences are not in it."""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor

from .modular import reference_gated

__all__ = ["supports", "forward"]


def supports(call: Any) -> Optional[str]:
    """Batch rows in every mode, with key padding and rotary; not packed sequences."""
    if call.cu_k is not None:
        return "packed sequences (cu_seqlens) are not in the oracle"
    return None


def forward(call: Any) -> Tensor:
    """Run a validated gated :class:`polymixer.ops.value_pom.call.ValueCall` on the oracle, cast back."""
    m = call.mixing
    y = reference_gated(call.x, *call.weights(), call.decay_weight, call.decay_bias,
                        heads=call.heads, mask=call.key_mask, causal=m.causal, block_size=m.block_size,
                        activation=m.activation, gate=m.gate, rope=m.rope, rope_base=m.rope_base,
                        positions=m.positions)
    return y.to(call.x.dtype)
