"""The gated value-carrying PoM: the value PoM's state with a data-dependent decay per head.

The value PoM's state S_i = Σ_{j ≤ i} φ_j ⊗ v_j remembers every token alike; gated linear attention, RetNet and
Mamba-2 let the model forget. Here each head h gets a decay a_{i,h} = exp(g_{i,h}) ∈ (0, 1] from its token,
g_{i,h} = −softplus(w_h · x_i + b_h) (initialised at RetNet's per-head rates, γ_h = 1 − 2^(−5−h)), and

    causal          S_i = a_i S_{i−1} + φ_i ⊗ v_i,   o_i = ψ_iᵀ S_i        weight of token j ≤ i: Π_{t=j+1..i} a_t
    full            both directions, as bidirectional state-space models: a forward scan (j ≤ i) plus a backward
                    scan (j > i, weight Π_{t=i+1..j} a_t) — the weight is exp(−|Λ_i − Λ_j|), Λ = Σ g
    block-causal    the forward scan over every visible token plus the backward scan inside each query's block
    packed          the scans restart at every sequence (and block) boundary

then the value PoM's readout: RMSNorm per head, gate, W_o. (The readout's RMSNorm makes the normaliser of the
mean irrelevant, so the decayed sums are read as they are.) A padding token neither contributes nor decays.

The causal scan runs in chunks of C tokens (the decay within a chunk from per-chunk cumulative sums of g, so nothing
long is ever subtracted; the (Dh × dv_h) state carried between chunks): O(N·C·D + N·D·dv/H). Streaming keeps the
state: O(1) per token. Cross-mixing and explicit (B, M, N) masks are refused: a decay needs the token order.

This module is the ``torch`` backend of ``gated_value_pom`` (the scan, ``supports`` / ``forward`` of a validated
call) and the float64 oracle; the front end is :mod:`polymixer.ops.gated_value_pom`, the Triton scan
:mod:`polymixer.ops.gated_value_pom.triton_kernels`, and what both backends share
:mod:`polymixer.ops.value_pom.features`.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import ROPE_BASE
from ..value_pom.features import (CHUNK, Scan, gated_features, heads_view, mix_both_ways, positions_or_default, readout,
                       rotate_heads, value_features)

__all__ = ["gated_scan", "gated_mix", "retnet_bias", "reference_gated", "supports", "forward"]


def retnet_bias(heads: int) -> Tensor:
    """Decay biases whose initial per-head decay is RetNet's γ_h = 1 − 2^(−5−h): softplus(b_h) = −log γ_h."""
    gamma = 1.0 - 2.0 ** (-5.0 - torch.arange(heads, dtype=torch.float64))
    return torch.log(torch.expm1(-torch.log(gamma))).float()


def _pad(t: Tensor, L: int, dim: int, value: float = 0.0) -> Tensor:
    extra = L - t.shape[dim]
    if extra <= 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [0, extra]
    return F.pad(t, pad, value=value)


def gated_scan(q: Tensor, k: Tensor, v: Tensor, g: Tensor, seg: Optional[Tensor] = None, chunk: int = CHUNK,
               state: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Σ_{j ≤ i, same segment} exp(Σ_{t=j+1..i} g_t) (q_i · k_j) v_j, chunked, and the state after the last token.

    Args:
        q, k: (B, H, N, Dh) (k already zero at padding); v: (B, H, N, E); g: (B, H, N) log-decays ≤ 0.
        seg: (B, N) integer segment ids (the scan restarts where the id changes), or None (one segment).
        state: (B, H, Dh, E) the state before the first token (streaming; it belongs to token 0's segment and
            decays by g_0 on entering it), or None.
    Returns:
        (o (B, H, N, E), the state after the last token (B, H, Dh, E), of the last token's segment).
    """
    B, H, N, Dh = q.shape
    E = v.shape[-1]
    C = chunk
    L = -(-max(N, 1) // C) * C
    nc = L // C
    if seg is None:
        seg = torch.zeros(B, N, dtype=torch.long, device=q.device)
    # padding tokens (k = v = 0, g = 0) join the last segment: they neither add to the state nor decay it
    segp = torch.cat([seg.long(), seg[:, -1:].long().expand(B, L - N)], dim=1)
    qc, kc, vc = (_pad(t, L, 2).reshape(B, H, nc, C, t.shape[-1]) for t in (q, k, v))
    gc = _pad(g, L, 2).reshape(B, H, nc, C)
    sc = segp.view(B, 1, nc, C)
    ell = torch.cumsum(gc, dim=-1)  # log-decay from the chunk's start to each token (≤ 0)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    same = (sc.unsqueeze(-1) == sc.unsqueeze(-2)) & causal  # (B, 1, nc, C, C)
    decay = torch.exp((ell.unsqueeze(-1) - ell.unsqueeze(-2)).masked_fill(~same, float("-inf")))
    scores = torch.einsum("bhctd,bhcsd->bhcts", qc, kc) * decay
    o = torch.einsum("bhcts,bhcse->bhcte", scores, vc)
    last = sc[..., -1:]  # each chunk's last segment
    to_end = torch.exp(ell[..., -1:] - ell) * (sc == last).to(ell.dtype)
    U = torch.einsum("bhctd,bhcte->bhcde", kc * to_end.unsqueeze(-1), vc)  # what each chunk leaves in the state
    prev_seg = torch.cat([segp[:, :1].view(B, 1, 1) if state is not None else segp.new_full((B, 1, 1), -2),
                          sc[:, :, :-1, -1]], dim=2)  # the segment the carried state belongs to
    open_ = (sc == prev_seg.unsqueeze(-1)).to(ell.dtype)  # queries the carried state reaches
    keep = (sc[..., 0] == prev_seg) & (sc[..., -1] == prev_seg)  # the state runs through the whole chunk
    S = state if state is not None else q.new_zeros(B, H, Dh, E)
    carried = []
    for c in range(nc):
        carried.append(S)
        S = S * (torch.exp(ell[:, :, c, -1]) * keep[:, :, c].to(ell.dtype)).view(B, H, 1, 1) + U[:, :, c]
    Sc = torch.stack(carried, dim=2)  # (B, H, nc, Dh, E): the state entering each chunk
    reach = (torch.exp(ell) * open_).unsqueeze(-1)
    o = o + torch.einsum("bhctd,bhcde->bhcte", qc * reach, Sc)
    return o.reshape(B, H, L, E)[:, :, :N], S


def gated_mix(q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, causal: bool, block_size: Optional[int],
              seq: Optional[Tensor] = None, chunk: int = CHUNK, state: Optional[Tensor] = None,
              scan: Optional[Scan] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """The mixing of every mode (:func:`polymixer.ops.value_pom.features.mix_both_ways`) with ``scan`` — this
    module's :func:`gated_scan` by default, or another with its arguments (the Triton kernels'): (o (B, H, N, E),
    the forward state after the last token)."""
    return mix_both_ways(gated_scan if scan is None else scan, q, k, v, g, causal=causal, block_size=block_size,
                         seq=seq, chunk=chunk, state=state)


def supports(call: Any) -> Optional[str]:
    """Every call (of the gated form: self-mixing, every mode, packed too)."""
    return None


def forward(call: Any) -> Tensor:
    """Run a validated gated :class:`polymixer.ops.value_pom.call.ValueCall` (one with a decay)."""
    q, k, vh, g, zs, seq = gated_features(call)
    o, _ = gated_mix(q, k, vh, g, causal=call.mixing.causal, block_size=call.mixing.block_size, seq=seq,
                     chunk=call.chunk)
    y = readout(o, zs, call.gate_bias, call.norm_weight, call.out_weight, call.out_bias, call.mixing.gate)
    return y.squeeze(0) if call.squeeze else y


def reference_gated(x: Tensor, in_weight: Tensor, gate_bias: Tensor, coeff: Tensor, coeff_q: Tensor,
                    shift_weight: Optional[Tensor], norm_weight: Tensor, out_weight: Tensor, out_bias: Optional[Tensor],
                    decay_weight: Tensor, decay_bias: Tensor, *, heads: int = 1, mask: Optional[Tensor] = None,
                    causal: bool = False, block_size: Optional[int] = None, activation: str = "leaky_clamp",
                    gate: str = "hardsigmoid", rope: Optional[str] = None, rope_base: float = ROPE_BASE,
                    positions: Optional[Tensor] = None) -> Tensor:
    """The float64 oracle, literally: an explicit (B, H, N, N) weight w_ij = vis_ij · exp(−|Λ_i − Λ_j|) with
    Λ = Σ g, o_i = Σ_j w_ij (ψ_i · φ_j) v_j, then the readout. O(N²): for tests."""
    f64 = lambda t: None if t is None else t.double()  # noqa: E731
    x = x.double()
    B, N, _ = x.shape
    dv = out_weight.shape[1]
    phi, v, psi, zs, _ = value_features(x, x, f64(in_weight), f64(coeff), f64(coeff_q), dv, f64(shift_weight), mask,
                                        None, True, activation)
    w = torch.ones(B, N, dtype=torch.float64) if mask is None else mask.double()
    k = heads_view(phi * w.unsqueeze(-1), heads)
    q, vh = heads_view(psi, heads), heads_view(v.double(), heads)
    if rope is not None:
        two_d = rope == "2d"
        pos = positions_or_default(positions, B, N, two_d, "positions", x.device)
        k, q = rotate_heads(k, pos, rope_base, two_d), rotate_heads(q, pos, rope_base, two_d)
    g = -F.softplus(F.linear(x, decay_weight.double(), decay_bias.double())) * w.unsqueeze(-1)
    lam = torch.cumsum(g.transpose(1, 2), dim=-1)  # (B, H, N)
    weight = torch.exp(-(lam.unsqueeze(-1) - lam.unsqueeze(-2)).abs())
    i = torch.arange(N)
    vis = torch.ones(N, N, dtype=torch.bool)
    if causal:
        last = i if block_size is None else (torch.div(i, block_size, rounding_mode="floor") + 1) * block_size - 1
        vis = i.unsqueeze(0) <= last.unsqueeze(1)
    scores = torch.einsum("bhid,bhjd->bhij", q, k) * weight * vis.double()
    o = torch.einsum("bhij,bhje->bhie", scores, vh)
    return readout(o, zs.double(), gate_bias.double(), norm_weight.double(), out_weight.double(), f64(out_bias),
                    gate)

