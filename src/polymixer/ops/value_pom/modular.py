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
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import (
    ActivationLike,
    CuSeqlens,
    batch_packed,
    check_bool_mask,
    check_mix_inputs,
    check_positions,
    check_tokens,
    default_positions,
    rope_angles,
    rotate,
)
from ..features import gate_mix, pattern_mask, poly_features, safe_inverse

__all__ = ["value_pom", "value_pom_step", "value_mix", "packed_causal_mix", "token_shift", "pad_packed", "CHUNK", "EPS",
           "supports", "forward", "check_layout", "check_rope", "value_features", "heads_view", "rotate_heads",
           "value_output", "positions_or_default"]

CHUNK = 64  # tokens per chunk of the causal form: the quadratic part is C / (dv/H) of the state part's work
EPS = 1e-6


def token_shift(z: Tensor, weight: Tensor, key_mask: Optional[Tensor] = None, prev: Optional[Tensor] = None,
                starts: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """``Σ_t weight[t] ⊙ z_{j−t}`` (t = 0 … W−1, ``weight`` (W, C)) along the tokens of (B, N, C) ``z``: a causal
    depthwise convolution of width W; W = 2 is the token shift ``weight[0] ⊙ z_j + weight[1] ⊙ z_{j−1}``.

    The W − 1 tokens before the first are ``prev`` (B, W − 1, C) (a stream's last tokens, oldest first) or zero; a
    masked token (``key_mask`` False) counts as zero, and so does every token before a sequence's first (``starts``
    (B, N) True, packed sequences). Returns the mixed tensor and the last W − 1 (masked) projections, the stream
    state (B, W − 1, C) (one token, unused, when W = 1).
    """
    W = weight.shape[0]
    lags = max(W - 1, 1)
    zm = z if key_mask is None else z * key_mask.unsqueeze(-1).to(z.dtype)
    if prev is None:
        prev = zm.new_zeros(zm.shape[0], lags, zm.shape[2])
    elif prev.dim() != 3 or prev.shape[1] != lags:
        raise ValueError(f"the token shift of width {W} keeps the last {lags} tokens: prev must be (B, {lags}, C), "
                         f"got {tuple(prev.shape)}")
    padded = torch.cat([prev.to(zm.dtype), zm], dim=1)  # (B, lags + N, C): token j sits at j + lags
    N = z.shape[1]
    out = weight[0] * z
    if starts is not None:  # starts in (j − t, j] cut token j off from token j − t
        seen = F.pad(torch.cumsum(starts.to(torch.int32), dim=1), (lags, 0))
    for t in range(1, W):
        before = padded[:, lags - t:lags - t + N]
        if starts is not None:
            before = before * (seen[:, lags:] == seen[:, lags - t:lags - t + N]).unsqueeze(-1).to(before.dtype)
        out = out + weight[t] * before
    return out, padded[:, -lags:]


def heads_view(t: Tensor, H: int) -> Tensor:
    """(B, N, C) → (B, H, N, C/H)."""
    B, N, C = t.shape
    return t.view(B, N, H, C // H).transpose(1, 2)


def rotate_heads(t: Tensor, positions: Tensor, base: float, two_d: bool) -> Tensor:
    """Rotate every head of (B, H, N, D_h) by its token's position ((N,) / (B, N), or (…, N, 2) for 2-D)."""
    cos, sin = rope_angles(positions, t.shape[-1], base, two_d, t.dtype)
    if cos.dim() == 3:  # (B, N, D_h/2) → (B, 1, N, D_h/2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return rotate(t, cos, sin)


def _pad_tokens(t: Tensor, n: int, dim: int) -> Tensor:
    extra = n - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


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
    B, H, M, Dh = q.shape
    N = k.shape[2]
    final_count = w.sum(1) if count is None else count + w.sum(1)
    if mask is not None or not causal:
        total = torch.einsum("bhnd,bhne->bhde", k, v)
        final_state = total if state is None else state + total
    if mask is not None:
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
        return o, cnt, final_state, final_count
    if not causal:
        o = torch.einsum("bhmd,bhde->bhme", q, final_state)
        return o, final_count.unsqueeze(1).expand(B, M), final_state, final_count

    # (block-)causal, top-left aligned: bring queries and context to one length L (zero-weight padding)
    K = 1 if block_size is None else block_size
    C = K if K >= chunk else K * (chunk // K)  # a chunk holds whole blocks
    L = -(-max(M, N) // C) * C
    qp, kp, vp = _pad_tokens(q, L, 2), _pad_tokens(k, L, 2), _pad_tokens(v, L, 2)
    wp = _pad_tokens(w[:, :L], L, 1)
    nc = L // C
    qc, kc, vc = (t.reshape(B, H, nc, C, t.shape[-1]) for t in (qp, kp, vp))
    U = torch.einsum("bhctd,bhcte->bhcde", kc, vc)  # each chunk's contribution to the state
    final_state = U.sum(2) if state is None else state + U.sum(2)
    if C == K:  # one block per chunk: a query sees its whole chunk, so no quadratic part at all
        S = torch.cumsum(U, dim=2)
        if state is not None:
            S = S + state.unsqueeze(2)
        o = torch.einsum("bhctd,bhcde->bhcte", qc, S)
    else:
        if nc == 1 and state is None:  # one chunk and nothing before it: no state part
            o = None
        else:
            S = torch.cumsum(U, dim=2) - U  # the state before each chunk
            if state is not None:
                S = S + state.unsqueeze(2)
            o = torch.einsum("bhctd,bhcde->bhcte", qc, S)
        blk = torch.arange(C, device=q.device) // K
        intra = (blk.unsqueeze(0) <= blk.unsqueeze(1)).to(q.dtype)  # (C queries, C keys) within a chunk
        scores = torch.einsum("bhctd,bhcsd->bhcts", qc, kc) * intra
        intra_o = torch.einsum("bhcts,bhcse->bhcte", scores, vc)
        o = intra_o if o is None else o + intra_o
    o = o.reshape(B, H, L, -1)[:, :, :M]
    cw = torch.cumsum(wp.view(B, L // K, K).sum(-1), dim=1)  # visible tokens up to each block's end
    cnt = cw.repeat_interleave(K, dim=1)[:, :M]
    if count is not None:
        cnt = cnt + count.unsqueeze(1)
    return o, cnt, final_state, final_count


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
    qp, kp, vp = _pad_tokens(q, L, 2), _pad_tokens(k, L, 2), _pad_tokens(v, L, 2)
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


def value_output(o: Tensor, cnt: Tensor, zs: Tensor, gate_bias: Tensor, norm_weight: Tensor, out_weight: Tensor,
            out_bias: Optional[Tensor], reduction: str, gate: ActivationLike) -> Tensor:
    """(B, H, M, dv_h) sums → mean (or sum) → RMSNorm per head with gain → gate → W_o: (B, M, d)."""
    if reduction == "mean":
        o = o * safe_inverse(cnt).unsqueeze(1).unsqueeze(-1)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + EPS)
    B, H, M, e = o.shape
    h = o.transpose(1, 2).reshape(B, M, H * e) * norm_weight.to(o.dtype)
    return F.linear(gate_mix(zs, gate_bias, h, gate), out_weight, out_bias)


def check_layout(in_weight: Tensor, coeff: Tensor, coeff_q: Tensor, out_weight: Tensor, heads: int
                  ) -> Tuple[int, int]:
    D, dv = coeff.shape[0], out_weight.shape[1]
    Ds = in_weight.shape[0] - 2 * D - dv
    if coeff_q.shape != coeff.shape:
        raise ValueError(f"coeff_q has shape {tuple(coeff_q.shape)}, coeff {tuple(coeff.shape)}: they must match")
    if Ds <= 0 or dv % Ds != 0:
        raise ValueError(f"in_weight of shape {tuple(in_weight.shape)} does not stack W_k ({D}), W_v ({dv}), "
                         f"W_q ({D}) and a gate whose width divides {dv}")
    if D % heads or dv % heads:
        raise ValueError(f"heads = {heads} must divide D = {D} and value_dim = {dv}")
    return D, dv


def value_features(ctx: Tensor, x: Tensor, in_weight: Tensor, coeff: Tensor, coeff_q: Tensor, dv: int,
              shift: Optional[Tensor], key_mask: Optional[Tensor], prev: Optional[Tensor], self_mix: bool,
              activation: ActivationLike, starts: Optional[Tensor] = None
              ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(φ (B, N, D), v (B, N, dv), ψ (B, M, D), z_s (B, M, Ds), the last key/value projections (B, W − 1, D + dv)
    that the token shift of width W keeps (the last one without a shift)).

    Self-mixing does one matrix product for all four projections."""
    D = coeff.shape[0]
    Ds = in_weight.shape[0] - 2 * D - dv
    # split, not slices: the backward of a split is one concatenation, that of each slice a zero-filled full copy
    if self_mix:  # in_weight stacks [W_k (D); W_v (dv); W_q (D); W_s (Ds)]: context rows, then query rows
        zkv, zq = F.linear(x, in_weight).split([D + dv, D + Ds], dim=-1)
    else:
        zkv, zq = F.linear(ctx, in_weight[:D + dv]), F.linear(x, in_weight[D + dv:])
    if shift is not None:
        zkv, last = token_shift(zkv, shift, key_mask, prev, starts)
    else:
        last = zkv[:, -1:] if key_mask is None else zkv[:, -1:] * key_mask[:, -1:, None].to(zkv.dtype)
    zk, zv = zkv.split([D, dv], dim=-1)
    zqq, zs = zq.split([D, Ds], dim=-1)
    phi = poly_features(zk, coeff, activation)
    psi = poly_features(zqq, coeff_q, activation)
    return phi, zv.to(phi.dtype), psi, zs, last


def pad_packed(t: Tensor, cu: Tensor) -> Tuple[Tensor, Tensor]:
    """(1, T, …) packed → (S, L_max, …) one row per sequence (zero padding on the right), and the (S, L_max)
    validity mask."""
    cu64 = cu.to(torch.int64)
    lens = cu64[1:] - cu64[:-1]
    L = int(lens.max()) if lens.numel() else 0
    ar = torch.arange(max(L, 1), device=t.device)
    valid = ar.unsqueeze(0) < lens.unsqueeze(1)
    idx = (cu64[:-1].unsqueeze(1) + ar.unsqueeze(0)).clamp(max=t.shape[1] - 1)
    rows = t[0][idx]
    return rows * valid.view(*valid.shape, *([1] * (rows.dim() - 2))).to(rows.dtype), valid


def _unpack_positions(pos: Tensor, n: int, cu: Tensor, two_d: bool) -> Tensor:
    """Positions of packed tokens ((T,) / (1, T), or (…, T, 2)) → (S, L_max[, 2]) like :func:`pad_packed`."""
    rows = pad_packed(pos.reshape(1, n, -1), cu)[0]
    return rows if two_d else rows.squeeze(-1)


def positions_or_default(pos: Optional[Tensor], B: int, n: int, two_d: bool, name: str, device: torch.device,
               offset: Optional[Tensor] = None) -> Tensor:
    if pos is None:
        pos = default_positions(n, device, two_d, name)
        return pos if offset is None else offset.unsqueeze(1) + pos
    check_positions(pos, B, n, two_d, name)
    return pos


def check_rope(rope: Optional[str], D: int, heads: int) -> None:
    if rope not in (None, "1d", "2d"):
        raise ValueError(f"rope must be None, '1d' or '2d', got {rope!r}")
    Dh = D // heads
    if (rope == "1d" and Dh % 2) or (rope == "2d" and Dh % 4):
        raise ValueError(f"{rope} rotary needs a key width per head (D/heads = {Dh}) divisible by "
                         f"{2 if rope == '1d' else 4}")


def value_pom(
    x: Tensor,
    context: Optional[Tensor],
    in_weight: Tensor,
    gate_bias: Tensor,
    coeff: Tensor,
    coeff_q: Tensor,
    shift_weight: Optional[Tensor],
    norm_weight: Tensor,
    out_weight: Tensor,
    out_bias: Optional[Tensor] = None,
    *,
    heads: int = 1,
    mask: Optional[Tensor] = None,
    causal: bool = False,
    block_size: Optional[int] = None,
    cu_seqlens: Optional[CuSeqlens] = None,
    positions: Optional[Tensor] = None,
    context_positions: Optional[Tensor] = None,
    activation: ActivationLike = "leaky_clamp",
    gate: ActivationLike = "hardsigmoid",
    reduction: str = "mean",
    rope: Optional[str] = None,
    rope_base: float = 10000.0,
    chunk: int = CHUNK,
    mix: Callable[..., Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]] = None,  # type: ignore[assignment]
    packed_mix: Callable[..., Tuple[Tensor, Tensor]] = None,  # type: ignore[assignment]
    packed_all_modes: bool = False,
) -> Tensor:
    """The value-carrying PoM (see the module docstring), with every argument of :func:`polymixer.functional.pom`.

    Args:
        in_weight: (2D + dv + Ds, d), W_k over W_v over W_q over W_s. Self-mixing does one matrix product.
        coeff / coeff_q: (D, k) polynomial coefficients of the keys / queries.
        shift_weight: (W, D + dv) weights of the current and the W − 1 previous tokens in the key / value
            projections (a causal depthwise convolution; W = 2: the token shift), or None (no token shift).
        norm_weight: (dv,) gain of the per-head RMSNorm of the readout.
        out_weight: (d, dv); heads: H, which splits D and dv (state D·dv/H floats per sequence).
        chunk: tokens per chunk of the (block-)causal form.
        mix / packed_mix: the mixing of the features — :func:`value_mix` and :func:`packed_causal_mix` by default;
            another backend passes its own (the Triton kernels). ``packed_all_modes``: ``packed_mix`` also takes
            ``cu_seqlens=``, ``causal=`` and ``block_size=`` and mixes every packed mode in place (else only packed
            causal calls run in place, the others one padded row per sequence).

    Returns:
        (B, M, d), or (T, d) for a 2-D packed input.
    """
    d = out_weight.shape[0]
    D, dv = check_layout(in_weight, coeff, coeff_q, out_weight, heads)
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    check_rope(rope, D, heads)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    x, context, squeeze = batch_packed(x, context, cu_seqlens)
    self_mix = context is None
    B, M, N, key_mask, general, cu_q, cu_k = check_mix_inputs(x, context, d, mask, causal, block_size, cu_seqlens)
    mix = value_mix if mix is None else mix
    packed_mix = packed_causal_mix if packed_mix is None else packed_mix
    kw = dict(heads=heads, causal=causal, block_size=block_size, activation=activation, gate=gate,
              reduction=reduction, rope=rope, rope_base=rope_base, chunk=chunk, mix=mix, packed_mix=packed_mix)
    weights = (in_weight, gate_bias, coeff, coeff_q, shift_weight, norm_weight, out_weight, out_bias)
    two_d = rope == "2d"

    if cu_k is not None and self_mix and ((causal and block_size is None) or packed_all_modes):  # in place
        mode = dict(cu_seqlens=cu_k, causal=causal, block_size=block_size) if packed_all_modes else None
        return _packed_causal(x, weights, cu_k, key_mask, positions, dv, heads, activation, gate, reduction, rope,
                              rope_base, chunk, squeeze, packed_mix, mode)
    if cu_k is not None:  # other packed modes: one row per sequence, the same computation, and back
        cq = cu_k if cu_q is None else cu_q
        xs, valid_q = pad_packed(x, cq)
        cs, valid_k = (xs, valid_q) if self_mix else pad_packed(context, cu_k)
        if key_mask is not None:  # a (1, T) key padding mask of the packed stream applies as well
            valid_k = valid_k & pad_packed(key_mask.unsqueeze(-1), cu_k)[0].squeeze(-1)
        pos = cpos = None
        if rope is not None:
            if positions is not None:
                check_positions(positions, B, M, two_d, "positions")
                pos = _unpack_positions(positions, M, cq, two_d)
            if context_positions is not None:
                check_positions(context_positions, B, N, two_d, "context_positions")
                cpos = _unpack_positions(context_positions, N, cu_k, two_d)
            elif self_mix:
                cpos = pos
        y = value_pom(xs, None if self_mix else cs, *weights, mask=valid_k, positions=pos,
                      context_positions=cpos, **kw)
        y = y[valid_q].unsqueeze(0)
        return y.squeeze(0) if squeeze else y

    ctx = x if self_mix else context
    phi, v, psi, zs, _ = value_features(ctx, x, in_weight, coeff, coeff_q, dv, shift_weight, key_mask, None, self_mix,
                                   activation)
    w = key_mask.to(phi.dtype) if key_mask is not None else phi.new_ones(B, N)
    k, q, vh = heads_view(phi * w.unsqueeze(-1), heads), heads_view(psi, heads), heads_view(v, heads)
    if rope is not None:
        if context_positions is None and self_mix:
            context_positions = positions
        kname = "positions" if self_mix else "context_positions"
        k = rotate_heads(k, positions_or_default(context_positions, B, N, two_d, kname, x.device), rope_base, two_d)
        q = rotate_heads(q, positions_or_default(positions, B, M, two_d, "positions", x.device), rope_base, two_d)
    o, cnt, _, _ = mix(q, k, vh, w, causal=causal, block_size=block_size, mask=general, chunk=chunk)
    y = value_output(o, cnt, zs, gate_bias, norm_weight, out_weight, out_bias, reduction, gate)
    return y.squeeze(0) if squeeze else y


def _packed_causal(x: Tensor, weights: Tuple, cu: Tensor, key_mask: Optional[Tensor], positions: Optional[Tensor],
                   dv: int, heads: int, activation: ActivationLike, gate: ActivationLike, reduction: str,
                   rope: Optional[str], rope_base: float, chunk: int, squeeze: bool,
                   packed_mix: Callable[..., Tuple[Tensor, Tensor]], mode: Optional[dict] = None) -> Tensor:
    """Self-mixing of packed sequences (1, T, d) in place by ``packed_mix`` (:func:`packed_causal_mix`: causal; a
    backend's own with ``mode`` = its cu_seqlens / causal / block_size keywords: every mode): no padding, the token
    shift and the state restart at each sequence's first token, and default rotary positions count within each
    sequence."""
    in_weight, gate_bias, coeff, coeff_q, shift_weight, norm_weight, out_weight, out_bias = weights
    T = x.shape[1]
    cu64 = cu.to(torch.int64)
    # the first token of every sequence (cu_seqlens holds no empty one); index_fill_, not an indexed assignment,
    # which synchronises with the host on a GPU
    starts = torch.zeros(T, dtype=torch.bool, device=x.device).index_fill_(0, cu64[:-1], True)
    ar = torch.arange(T, device=x.device)
    first = torch.cummax(torch.where(starts, ar, 0), dim=0).values  # each token's sequence start
    phi, v, psi, zs, _ = value_features(x, x, in_weight, coeff, coeff_q, dv, shift_weight, key_mask, None, True,
                                   activation, starts.unsqueeze(0))
    w = key_mask.to(phi.dtype) if key_mask is not None else phi.new_ones(1, T)
    k, q, vh = heads_view(phi * w.unsqueeze(-1), heads), heads_view(psi, heads), heads_view(v, heads)
    if rope is not None:
        two_d = rope == "2d"
        if positions is None and not two_d:
            positions = (ar - first).unsqueeze(0)
        pos = positions_or_default(positions, 1, T, two_d, "positions", x.device)
        k, q = rotate_heads(k, pos, rope_base, two_d), rotate_heads(q, pos, rope_base, two_d)
    o, cnt = packed_mix(q, k, vh, w, first, chunk, **(mode or {}))
    y = value_output(o, cnt, zs, gate_bias, norm_weight, out_weight, out_bias, reduction, gate)
    return y.squeeze(0) if squeeze else y


def value_pom_step(
    x: Tensor,
    state: Tensor,
    count: Tensor,
    offset: Tensor,
    prev: Tensor,
    in_weight: Tensor,
    gate_bias: Tensor,
    coeff: Tensor,
    coeff_q: Tensor,
    shift_weight: Optional[Tensor],
    norm_weight: Tensor,
    out_weight: Tensor,
    out_bias: Optional[Tensor] = None,
    *,
    heads: int = 1,
    causal: bool = True,
    mask: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
    activation: ActivationLike = "leaky_clamp",
    gate: ActivationLike = "hardsigmoid",
    reduction: str = "mean",
    rope: Optional[str] = None,
    rope_base: float = 10000.0,
    chunk: int = CHUNK,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Streaming: consume a chunk (B, T, d) given the state of everything before it.

    ``state`` (B, H, D_h, dv_h) and ``count`` (B,) are the running sums, ``offset`` (B,) the stream index of the next
    token, ``prev`` (B, W − 1, D + dv) the last tokens' key / value projections (for the token shift of width W).
    ``causal=False`` makes the chunk one block (block-causal streaming). Returns (y, state, count, offset, prev).
    """
    d = out_weight.shape[0]
    D, dv = check_layout(in_weight, coeff, coeff_q, out_weight, heads)
    check_tokens(x, d, "x")
    B, T, _ = x.shape
    H = heads
    if state.shape != (B, H, D // H, dv // H):
        raise ValueError(f"state has shape {tuple(state.shape)} but x has batch {B} and the mixer keeps "
                         f"{(B, H, D // H, dv // H)}; index or re-initialise the state")
    if mask is not None:
        check_bool_mask(mask, [(B, T)], f"a chunk of batch {B} × {T} tokens")
    check_rope(rope, D, heads)
    acc = state.dtype
    phi, v, psi, zs, last = value_features(x, x, in_weight, coeff, coeff_q, dv, shift_weight, mask, prev, True,
                                      activation)
    phi, v, psi = phi.to(acc), v.to(acc), psi.to(acc)
    w = mask.to(acc) if mask is not None else phi.new_ones(B, T)
    k, q, vh = heads_view(phi * w.unsqueeze(-1), H), heads_view(psi, H), heads_view(v, H)
    if rope is not None:
        two_d = rope == "2d"
        if positions is None and two_d:
            raise ValueError("2-D rotary streaming needs explicit positions of shape (B, T, 2) or (T, 2)")
        pos = positions_or_default(positions, B, T, two_d, "positions", x.device, offset)
        k, q = rotate_heads(k, pos, rope_base, two_d), rotate_heads(q, pos, rope_base, two_d)
    o, cnt, new_state, new_count = value_mix(q, k, vh, w, causal=True, block_size=None if causal else T,
                                             chunk=chunk, state=state, count=count)
    y = value_output(o, cnt, zs, gate_bias, norm_weight, out_weight, out_bias, reduction, gate)
    return y, new_state, new_count, offset + T, last.to(prev.dtype)


def supports(call) -> Optional[str]:
    """Every call."""
    return None


def forward(call) -> Tensor:  # call: polymixer.ops.value_pom.ValueCall
    return value_pom(*call.args, **call.kwargs)
