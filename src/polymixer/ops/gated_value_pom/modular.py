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
state (a call with a state): O(1) per token. Cross-mixing and explicit (B, M, N) masks are refused: a decay needs
the token order.

This module is the ``torch`` backend of ``gated_value_pom`` (the scan, ``supports`` / ``forward`` of a validated
call); the front end is :mod:`polymixer.ops.gated_value_pom`, the Triton scan
:mod:`polymixer.ops.gated_value_pom.triton_kernels`, the float64 oracle :mod:`polymixer.ops.gated_value_pom.reference`,
and what the backends share :mod:`polymixer.ops.features`.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..call import Call, PoMState, every_call as supports  # every gated call: streams too
from ..features import CHUNK, Scan, call_features, decay_logs, gated_features, mix_both_ways, pad_tokens, readout

__all__ = ["gated_scan", "gated_mix", "supports", "forward"]


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
    qc, kc, vc = (pad_tokens(t, L, 2).reshape(B, H, nc, C, t.shape[-1]) for t in (q, k, v))
    gc = pad_tokens(g, L, 2).reshape(B, H, nc, C)
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
    """The mixing of every mode (:func:`polymixer.ops.features.mix_both_ways`) with ``scan`` — this
    module's :func:`gated_scan` by default, or another with its arguments (the Triton kernels'): (o (B, H, N, E),
    the forward state after the last token)."""
    return mix_both_ways(gated_scan if scan is None else scan, q, k, v, g, causal=causal, block_size=block_size,
                         seq=seq, chunk=chunk, state=state)


def forward(call: Call) -> Union[Tensor, Tuple[Tensor, PoMState]]:
    """Run a validated gated call; a stream's chunk after its state."""
    if call.state is not None:
        return _stream(call)
    q, k, vh, g, zs, seq = gated_features(call)
    o, _ = gated_mix(q, k, vh, g, causal=call.causal, block_size=call.block_size, seq=seq, chunk=call.chunk)
    return readout(o, zs, call.weights, call.gate)


def _stream(call: Call) -> Tuple[Tensor, PoMState]:
    """The next chunk (B, T, d) of a causal stream after the decayed state of everything before it, by the chunked
    scan from that state. Returns (y, the state after the chunk)."""
    x, state, mask, T = call.x, call.state, call.key_mask, call.N
    positions = state.offset.unsqueeze(1) + torch.arange(T, device=x.device)
    (q, k, vh, _, zs), last = call_features(call, positions, prev=state.prev, dtype=state.sum.dtype)
    g = decay_logs(x, call.weights.decay_weight, call.weights.decay_bias, mask).to(state.sum.dtype)
    o, new_state = gated_scan(q, k, vh, g, None, call.chunk, state.sum)
    y = readout(o, zs, call.weights, call.gate)
    seen = T if mask is None else mask.to(state.count.dtype).sum(1)
    return y, PoMState(new_state, state.count + seen, state.offset + T, last.to(state.prev.dtype))
