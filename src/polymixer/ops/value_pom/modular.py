"""The ``torch`` backend of the value-carrying PoM (every mode, every device): a state that binds each token's value
to its polynomial key features.

PoM's state is one D-vector, read through an elementwise gate. That state records which features occurred, but it
cannot say which value followed which key, and recall (MQAR) fails. The value-carrying form keeps PoM's polynomial
features. Its state holds a value per token and is read by the query's own polynomial features. With D and dv split
into ``heads`` heads of D_h = D/H and dv_h = dv/H channels:

    k_j = t_0 ⊙ (W_k c_j) + t_1 ⊙ (W_k c_{j−1})        a short causal token shift (the previous token's projection;
    v_j = t_0 ⊙ (W_v c_j) + t_1 ⊙ (W_v c_{j−1})          width W > 2: Σ_{t<W} t_t ⊙ W c_{j−t}, a short convolution)
    φ_j = poly_k(act(k_j)),   ψ_i = poly_q(act(W_q x_i))          per head, rotated by position with rotary
    S_i = Σ_{j visible to i} φ_j ⊗ v_j   (÷ the visible count)    a D_h × dv_h state per head
    y_i = W_o (gate(W_s x_i + b) ⊙ RMSNorm_head(ψ_iᵀ S_i))

PoM's vector state is the special case where every token carries the same value. The cost is O(N·D·dv/H) for the
state form. Causal and block-causal mixing use the chunked form: quadratic inside a chunk of C tokens, with the state
carried between chunks, O(N·C·D + N·D·dv/H), and never an N × N tensor. Packed causal sequences (``cu_seqlens``,
LM packing) mix in place, the state restarting at each sequence's first token; other packed modes pad one row per
sequence. Only an explicit (B, M, N) mask is quadratic, as in PoM.

A stream (a call with a state) mixes its chunk from the state of everything before it: O(D·dv/H) state per sequence.

This module is the mixing of the torch form (:func:`value_mix`, :func:`packed_causal_mix`) and its backend
(``supports`` / ``forward`` of a validated :class:`~polymixer.ops.call.Call`); the feature maps and the readout,
which every backend shares, are in :mod:`polymixer.ops.features`.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..call import Call, PoMState, every_call as supports  # the torch form takes every call
from ..features import (CHUNK, call_features, full_mix, packed_features, pad_tokens, padded_rows, pattern_mask,
                        value_output)

__all__ = ["value_mix", "packed_causal_mix", "supports", "forward"]


def value_mix(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    *,
    causal: bool = False,
    block_size: Optional[int] = None,
    mask: Optional[Tensor] = None,
    chunk: int = CHUNK,
    state: Optional[Tensor] = None,
    count: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Σ_{j visible to i} (q_i · k_j) v_j, the visible counts, and the state after the last token.

    Args:
        q: (B, H, M, D_h) query features; k: (B, H, N, D_h) key features, already zero where ``w`` is 0;
            v: (B, H, N, dv_h); w: (B, N) key weights (1 takes part, 0 masked).
        causal / block_size: j ≤ i, or j's block ≤ i's block (top-left aligned: query i and context token i share a
            position). mask: (B, M, N) bool, explicit visibility (quadratic).
        state / count: (B, H, D_h, dv_h) and (B,) sums of the tokens before these (streaming), or None.

    Returns:
        (o (B, H, M, dv_h) unnormalised, counts (B, M), final state (B, H, D_h, dv_h), final count (B,)), all in the
        features' dtype. The final state covers every context token.
    """
    B, _, M, _ = q.shape
    if mask is None and not causal and state is None:
        return full_mix(q, k, v, w)
    final_count = w.sum(1) if count is None else count + w.sum(1)
    if mask is not None or not causal:
        total = torch.einsum("bhnd,bhne->bhde", k, v)
        final_state = total if state is None else state + total
    if mask is not None:
        o, cnt = _masked_mix(q, k, v, w, mask, causal, block_size, state, count)
        return o, cnt, final_state, final_count
    if not causal:
        o = torch.einsum("bhmd,bhde->bhme", q, final_state)
        return o, final_count.unsqueeze(1).expand(B, M), final_state, final_count
    o, cnt, final_state = _chunked_causal_mix(q, k, v, w, block_size, chunk, state, count)
    return o, cnt, final_state, final_count


def _masked_mix(q: Tensor, k: Tensor, v: Tensor, w: Tensor, mask: Tensor, causal: bool, block_size: Optional[int],
                state: Optional[Tensor], count: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """(o, counts) of :func:`value_mix` under an explicit (B, M, N) ``mask`` (and the causal pattern): the quadratic
    form, every (query, key) score, plus the streamed ``state`` / ``count`` of the tokens before."""
    M, N = q.shape[2], k.shape[2]
    vis = mask
    if causal:
        vis = vis & pattern_mask(M, N, block_size, q.device)
    vf = vis.to(q.dtype) * w.unsqueeze(1)
    scores = torch.einsum("bhmd,bhnd->bhmn", q, k) * vf.unsqueeze(1)
    o = torch.einsum("bhmn,bhne->bhme", scores, v)
    cnt = vf.sum(-1)
    if state is not None:
        o = o + torch.einsum("bhmd,bhde->bhme", q, state)
        cnt = cnt + count.unsqueeze(1)
    return o, cnt


def _chunked_causal_mix(q: Tensor, k: Tensor, v: Tensor, w: Tensor, block_size: Optional[int], chunk: int,
                        state: Optional[Tensor], count: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """(o, counts, final state) of :func:`value_mix` under (block-)causal masking, top-left aligned: queries and
    context brought to one length L (zero-weight padding) and cut into chunks of whole blocks, the state carried
    between chunks (:func:`_chunk_outputs`)."""
    B, H, M, _ = q.shape
    N = k.shape[2]
    K = 1 if block_size is None else block_size
    C = K if K >= chunk else K * (chunk // K)  # a chunk holds whole blocks
    L = -(-max(M, N) // C) * C
    qp, kp, vp = pad_tokens(q, L, 2), pad_tokens(k, L, 2), pad_tokens(v, L, 2)
    wp = pad_tokens(w[:, :L], L, 1)
    nc = L // C
    qc, kc, vc = (t.reshape(B, H, nc, C, t.shape[-1]) for t in (qp, kp, vp))
    U = torch.einsum("bhctd,bhcte->bhcde", kc, vc)  # each chunk's contribution to the state
    final_state = U.sum(2) if state is None else state + U.sum(2)
    o = _chunk_outputs(qc, kc, vc, U, K, state)
    o = o.reshape(B, H, L, -1)[:, :, :M]
    cw = torch.cumsum(wp.view(B, L // K, K).sum(-1), dim=1)  # visible tokens up to each block's end
    cnt = cw.repeat_interleave(K, dim=1)[:, :M]
    if count is not None:
        cnt = cnt + count.unsqueeze(1)
    return o, cnt, final_state


def _chunk_outputs(qc: Tensor, kc: Tensor, vc: Tensor, U: Tensor, K: int, state: Optional[Tensor]) -> Tensor:
    """(B, H, nc, C, dv_h): each chunk's queries read the state before their chunk (plus ``state``, the tokens before
    the call) and, unless a chunk is one block of K tokens (then its own contribution ``U`` too), the quadratic part
    inside the chunk, block-causal."""
    nc, C = qc.shape[2], qc.shape[3]
    whole = C == K  # one block per chunk: a query sees its whole chunk, so no quadratic part at all
    o = None  # one chunk and nothing before it: no state part
    if whole or nc > 1 or state is not None:
        S = torch.cumsum(U, dim=2) if whole else torch.cumsum(U, dim=2) - U  # the state after / before each chunk
        if state is not None:
            S = S + state.unsqueeze(2)
        o = torch.einsum("bhctd,bhcde->bhcte", qc, S)
    if whole:
        return o
    blk = torch.arange(C, device=qc.device) // K
    intra = (blk.unsqueeze(0) <= blk.unsqueeze(1)).to(qc.dtype)  # (C queries, C keys) within a chunk
    scores = torch.einsum("bhctd,bhcsd->bhcts", qc, kc) * intra
    intra_o = torch.einsum("bhcts,bhcse->bhcte", scores, vc)
    return intra_o if o is None else o + intra_o


def packed_causal_mix(q: Tensor, k: Tensor, v: Tensor, w: Tensor, first: Tensor, chunk: int = CHUNK
                      ) -> Tuple[Tensor, Tensor]:
    """Causal :func:`value_mix` over packed sequences, without padding them to one length.

    Args:
        q, k, v: (1, H, T, ·) features of the packed stream (k already zero where ``w`` is 0); w: (1, T) key weights;
            first: (T,) int64, the index of each token's sequence's first token (it names the sequence).

    Chunks of C tokens run over the stream as it is. Inside a chunk the quadratic part also requires the same
    sequence; between chunks the carried state restarts wherever a sequence starts: the state entering chunk c+1 is
    a_c·S_c + T_c, with T_c the chunk's contribution from its last sequence and a_c = 0 when a sequence starts in
    chunk c. That segmented prefix sum is a float64 cumulative sum less its value before the last restart (exact to
    float64 rounding). O(T·C·D + T·D·dv/H). Returns (o (1, H, T, dv_h) unnormalised, counts (1, T)).
    """
    _, H, T, Dh = q.shape
    starts = first == torch.arange(T, device=q.device)
    C = chunk
    L = -(-T // C) * C
    qp, kp, vp = pad_tokens(q, L, 2), pad_tokens(k, L, 2), pad_tokens(v, L, 2)
    nc = L // C
    segp = torch.cat([first, first.new_full((L - T,), -1)]).view(nc, C)  # padding: a sequence of its own
    stp = torch.cat([starts, starts.new_ones(L - T)]).view(nc, C)
    qc, kc, vc = (t.reshape(1, H, nc, C, t.shape[-1]) for t in (qp, kp, vp))
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    same = (segp.unsqueeze(2) == segp.unsqueeze(1)) & causal  # (nc, C queries, C keys)
    scores = torch.einsum("bhctd,bhcsd->bhcts", qc, kc) * same.to(q.dtype)
    o = torch.einsum("bhcts,bhcse->bhcte", scores, vc)
    if nc > 1:
        tail = (segp == segp[:, -1:]).to(q.dtype)  # the tokens of each chunk's last sequence
        Tc = torch.einsum("bhctd,bhcte->bhcde", kc * tail[None, None, :, :, None], vc)
        keep = (segp[:, 0] == segp[:, -1]) & ~stp[:, 0]  # a_c: no sequence starts inside chunk c
        idx = torch.arange(nc, device=q.device)
        last_restart = torch.cummax(torch.where(keep, -1, idx), dim=0).values.clamp(min=0)
        P = torch.cumsum(Tc.to(torch.float64), dim=2)
        before = torch.cat([torch.zeros_like(P[:, :, :1]), P[:, :, :-1]], dim=2)
        after = (P - before[:, :, last_restart]).to(q.dtype)  # the state after chunk c, of its last sequence
        state_in = torch.cat([torch.zeros_like(after[:, :, :1]), after[:, :, :-1]], dim=2)
        open_seq = (torch.cumsum(stp.to(torch.int32), dim=1) == 0).to(q.dtype)  # no start in [cC, i]
        o = o + torch.einsum("bhctd,bhcde->bhcte", qc * open_seq[None, None, :, :, None], state_in)
    o = o.reshape(1, H, L, -1)[:, :, :T]
    cw = torch.cumsum(w[0].to(torch.float64), dim=0)  # visible tokens: those of the sequence up to i
    cnt = cw - (cw - w[0].to(torch.float64))[first]
    return o, cnt.to(q.dtype).unsqueeze(0)


def forward(call: Call) -> Union[Tensor, Tuple[Tensor, PoMState]]:
    """Run a validated call: packed causal self-mixing in place, other packed modes one padded row per sequence (the
    same computation, and back), batch rows as they are; a stream's chunk after its state."""
    m = call.mixing
    if call.state is not None:
        return _stream(call)
    if call.cu_k is not None and call.self_mix and m.causal and m.block_size is None:
        (q, k, vh, w, zs), first = packed_features(call)
        o, cnt = packed_causal_mix(q, k, vh, w, first, call.chunk)
    elif call.cu_k is not None:
        rows, valid = padded_rows(call)
        return forward(rows)[valid].unsqueeze(0)
    else:
        (q, k, vh, w, zs), _ = call_features(call)
        o, cnt, _, _ = value_mix(q, k, vh, w, causal=m.causal, block_size=m.block_size, mask=call.mask,
                                 chunk=call.chunk)
    return value_output(o, cnt, zs, call.weights, m)


def _stream(call: Call) -> Tuple[Tensor, PoMState]:
    """The next chunk (B, T, d) of a stream after ``call.state``: the token shift continues from the state's last
    projections, the chunk mixes from its (B, H, D_h, dv_h) sums — causal, or ``causal=False`` one block. Returns
    (y, the state after the chunk)."""
    m, state, T = call.mixing, call.state, call.N
    positions = state.offset.unsqueeze(1) + torch.arange(T, device=call.x.device)
    (q, k, vh, w, zs), last = call_features(call, positions, prev=state.prev, dtype=state.sum.dtype)
    o, cnt, new_state, new_count = value_mix(q, k, vh, w, causal=True, block_size=None if m.causal else T,
                                             chunk=call.chunk, state=state.sum, count=state.count)
    y = value_output(o, cnt, zs, call.weights, m)
    return y, PoMState(new_state, new_count, state.offset + T, last.to(state.prev.dtype))
