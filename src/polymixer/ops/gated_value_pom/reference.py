"""The gated value PoM's float64 oracle — :func:`reference_gated`, explicit decay weights exp(−|Λ_i − Λ_j|) — and
the ``reference`` backend that runs a call on it. O(N²): for tests and checks, never chosen automatically; packed
sequences are not in it."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..call import Call
from ..common import ROPE_BASE
from ..reference import no_stream, visibility
from ..features import heads_view, positions_or_default, readout, rotate_heads, value_features
from .call import GatedValuePomWeights

__all__ = ["reference_gated", "supports", "forward"]


def reference_gated(x: Tensor, weights: GatedValuePomWeights, *, heads: int = 1, mask: Optional[Tensor] = None,
                    causal: bool = False, block_size: Optional[int] = None, activation: str = "leaky_clamp",
                    gate: str = "hardsigmoid", rope: Optional[str] = None, rope_base: float = ROPE_BASE,
                    positions: Optional[Tensor] = None) -> Tensor:
    """The float64 oracle, literally: an explicit (B, H, N, N) weight w_ij = vis_ij · exp(−|Λ_i − Λ_j|) with
    Λ = Σ g, o_i = Σ_j w_ij (ψ_i · φ_j) v_j, then the readout. O(N²): for tests."""
    w64 = GatedValuePomWeights(*(None if t is None else t.double() for t in weights))
    x = x.double()
    B, N, _ = x.shape
    phi, v, psi, zs, _ = value_features(x, x, w64, mask, None, True, activation)
    w = torch.ones(B, N, dtype=torch.float64) if mask is None else mask.double()
    k = heads_view(phi * w.unsqueeze(-1), heads)
    q, vh = heads_view(psi, heads), heads_view(v.double(), heads)
    if rope is not None:
        two_d = rope == "2d"
        pos = positions_or_default(positions, B, N, two_d, "positions", x.device)
        k, q = rotate_heads(k, pos, rope_base, two_d), rotate_heads(q, pos, rope_base, two_d)
    g = -F.softplus(F.linear(x, w64.decay_weight, w64.decay_bias)) * w.unsqueeze(-1)
    lam = torch.cumsum(g.transpose(1, 2), dim=-1)  # (B, H, N)
    weight = torch.exp(-(lam.unsqueeze(-1) - lam.unsqueeze(-2)).abs())
    vis = visibility(1, N, N, causal=causal, block_size=block_size)[0]
    scores = torch.einsum("bhid,bhjd->bhij", q, k) * weight * vis.double()
    o = torch.einsum("bhij,bhje->bhie", scores, vh)
    return readout(o, zs.double(), w64, gate)


def supports(call: Call) -> Optional[str]:
    """Batch rows in every mode, with key padding and rotary; not packed sequences, not a stream."""
    if call.state is not None:
        return no_stream(call)
    if call.cu_k is not None:
        return "packed sequences (cu_seqlens) are not in the oracle"
    return None


def forward(call: Call) -> Tensor:
    """Run a validated gated call on the oracle, cast back."""
    y = reference_gated(call.x, call.weights, heads=call.heads, mask=call.key_mask, causal=call.causal,
                        block_size=call.block_size, activation=call.activation, gate=call.gate, rope=call.rope,
                        rope_base=call.rope_base, positions=call.positions)
    return y.to(call.x.dtype)
