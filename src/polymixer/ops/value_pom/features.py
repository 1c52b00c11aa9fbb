"""What every backend of the value-carrying PoM (and of its gated form) shares: the feature maps before the mixing
and the readout after it. The backends differ only in the mixing itself (the torch form's einsums, the Triton
kernels); everything around it is here, so no backend calls another one.

* before the mixing: the projections (one matrix product when self-mixing), the token shift / short convolution,
  the polynomial feature maps, the heads view and the rotary rotation — :func:`value_features`,
  :func:`row_features` (one batch row per sequence) and :func:`packed_features` (packed sequences in place);
* packed sequences that a backend does not mix in place: :func:`padded_rows` lays them out one row each;
* after the mixing: mean, RMSNorm per head, gate, W_o — :func:`value_output` (:func:`readout` without the mean);
* the gated form's decay: :func:`decay_logs`, :func:`sequence_ids` and :func:`mix_both_ways` (a forward scan plus a
  backward one, whichever scan a backend brings).

The calls are :class:`polymixer.ops.value_pom.call.ValueCall` objects, validated once by their front end.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import ActivationLike, check_positions, default_positions, rope_angles, rotate
from ..features import gate_mix, poly_features, reverse_logs, safe_inverse

__all__ = ["CHUNK", "EPS", "token_shift", "heads_view", "rotate_heads", "pad_tokens", "pad_packed",
           "unpack_positions", "positions_or_default", "value_features", "value_output", "readout", "output",
           "full_mix", "row_features", "packed_features", "padded_rows", "packed_starts", "decay_logs", "sequence_ids",
           "gated_features", "mix_both_ways", "Features"]

CHUNK = 64  # tokens per chunk of the causal form: the quadratic part is C / (dv/H) of the state part's work
EPS = 1e-6

# (q (B, H, M, D_h), k (B, H, N, D_h) zero at padding, v (B, H, N, dv_h), key weights w (B, N), z_s (B, M, Ds))
Features = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


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


def pad_tokens(t: Tensor, n: int, dim: int) -> Tensor:
    """``t`` with zeros appended along ``dim`` up to ``n`` entries (unchanged when it has that many)."""
    extra = n - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


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


def unpack_positions(pos: Tensor, n: int, cu: Tensor, two_d: bool) -> Tensor:
    """Positions of packed tokens ((T,) / (1, T), or (…, T, 2)) → (S, L_max[, 2]) like :func:`pad_packed`."""
    rows = pad_packed(pos.reshape(1, n, -1), cu)[0]
    return rows if two_d else rows.squeeze(-1)


def positions_or_default(pos: Optional[Tensor], B: int, n: int, two_d: bool, name: str, device: torch.device,
                         offset: Optional[Tensor] = None) -> Tensor:
    """``pos`` checked against (B, n), or the default: each token's index (plus a stream's ``offset`` (B,))."""
    if pos is None:
        pos = default_positions(n, device, two_d, name)
        return pos if offset is None else offset.unsqueeze(1) + pos
    check_positions(pos, B, n, two_d, name)
    return pos


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


def readout(o: Tensor, zs: Tensor, gate_bias: Tensor, norm_weight: Tensor, out_weight: Tensor,
            out_bias: Optional[Tensor], gate: ActivationLike) -> Tensor:
    """(B, H, M, dv_h) mixed values → RMSNorm per head with gain → gate → W_o: (B, M, d)."""
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + EPS)
    B, H, M, e = o.shape
    h = o.transpose(1, 2).reshape(B, M, H * e) * norm_weight.to(o.dtype)
    return F.linear(gate_mix(zs, gate_bias, h, gate), out_weight, out_bias)


def value_output(o: Tensor, cnt: Tensor, zs: Tensor, gate_bias: Tensor, norm_weight: Tensor, out_weight: Tensor,
                 out_bias: Optional[Tensor], reduction: str, gate: ActivationLike) -> Tensor:
    """(B, H, M, dv_h) sums → mean (or sum) over the ``cnt`` (B, M) visible tokens → :func:`readout`: (B, M, d)."""
    if reduction == "mean":
        o = o * safe_inverse(cnt).unsqueeze(1).unsqueeze(-1)
    return readout(o, zs, gate_bias, norm_weight, out_weight, out_bias, gate)


def output(call: Any, o: Tensor, cnt: Tensor, zs: Tensor) -> Tensor:
    """:func:`value_output` with the call's weights and mode: (B, M, d)."""
    return value_output(o, cnt, zs, call.gate_bias, call.norm_weight, call.out_weight, call.out_bias,
                        call.mixing.reduction, call.mixing.gate)


def full_mix(q: Tensor, k: Tensor, v: Tensor, w: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Full mixing (every query sees every weighted key): two matrix products through the (B, H, D_h, dv_h) state.
    Returns (o, counts (B, M), the state, the total weight (B,)), as
    :func:`polymixer.ops.value_pom.modular.value_mix` does."""
    state = torch.einsum("bhnd,bhne->bhde", k, v)
    total = w.sum(1)
    o = torch.einsum("bhmd,bhde->bhme", q, state)
    return o, total.unsqueeze(1).expand(q.shape[0], q.shape[2]), state, total


def _weights(call: Any) -> Tuple[Tensor, ...]:
    return call.in_weight, call.coeff, call.coeff_q


def row_features(call: Any) -> Features:
    """The features of an unpacked call (batch rows; cross-mixing too): projections, token shift, polynomials, heads
    and rotary positions (the context's default to the queries' when self-mixing)."""
    m = call.mixing
    x, self_mix = call.x, call.context is None
    ctx = x if self_mix else call.context
    phi, v, psi, zs, _ = value_features(ctx, x, *_weights(call), call.dv, call.shift_weight, call.key_mask, None,
                                        self_mix, m.activation)
    w = call.key_mask.to(phi.dtype) if call.key_mask is not None else phi.new_ones(call.B, call.N)
    H = call.heads
    k, q, vh = heads_view(phi * w.unsqueeze(-1), H), heads_view(psi, H), heads_view(v, H)
    if m.rope is not None:
        cpos = m.positions if m.context_positions is None and self_mix else m.context_positions
        kname = "positions" if self_mix else "context_positions"
        k = rotate_heads(k, positions_or_default(cpos, call.B, call.N, m.two_d, kname, x.device), m.rope_base,
                         m.two_d)
        q = rotate_heads(q, positions_or_default(m.positions, call.B, call.M, m.two_d, "positions", x.device),
                         m.rope_base, m.two_d)
    return q, k, vh, w, zs


def packed_starts(cu: Tensor, T: int, device: torch.device) -> Tuple[Tensor, Tensor]:
    """(starts (T,) bool: a sequence's first token, first (T,) int64: the index of each token's sequence's first
    token) of packed offsets ``cu`` (no empty sequence)."""
    # index_fill_, not an indexed assignment, which synchronises with the host on a GPU
    starts = torch.zeros(T, dtype=torch.bool, device=device).index_fill_(0, cu.to(torch.int64)[:-1], True)
    ar = torch.arange(T, device=device)
    return starts, torch.cummax(torch.where(starts, ar, 0), dim=0).values


def packed_features(call: Any) -> Tuple[Features, Tensor]:
    """The features of packed self-mixing (1, T, d) in place — the token shift restarts at each sequence's first
    token and default rotary positions count within each sequence — and ``first`` (T,), each token's sequence's
    first token."""
    m = call.mixing
    x, T = call.x, call.N
    starts, first = packed_starts(call.cu_k, T, x.device)
    phi, v, psi, zs, _ = value_features(x, x, *_weights(call), call.dv, call.shift_weight, call.key_mask, None, True,
                                        m.activation, starts.unsqueeze(0))
    w = call.key_mask.to(phi.dtype) if call.key_mask is not None else phi.new_ones(1, T)
    H = call.heads
    k, q, vh = heads_view(phi * w.unsqueeze(-1), H), heads_view(psi, H), heads_view(v, H)
    if m.rope is not None:
        positions = m.positions
        if positions is None and not m.two_d:
            positions = (torch.arange(T, device=x.device) - first).unsqueeze(0)
        pos = positions_or_default(positions, 1, T, m.two_d, "positions", x.device)
        k, q = rotate_heads(k, pos, m.rope_base, m.two_d), rotate_heads(q, pos, m.rope_base, m.two_d)
    return (q, k, vh, w, zs), first


def padded_rows(call: Any) -> Tuple[Any, Tensor]:
    """A packed call laid out one batch row per sequence (zero padding on the right, masked out): (the call of the
    rows, the (S, L_max) validity of the queries, to pick the packed outputs back with ``y[valid]``)."""
    m = call.mixing
    self_mix, cu_k = call.context is None, call.cu_k
    cq = cu_k if call.cu_q is None else call.cu_q
    xs, valid_q = pad_packed(call.x, cq)
    cs, valid_k = (xs, valid_q) if self_mix else pad_packed(call.context, cu_k)
    if call.key_mask is not None:  # a (1, T) key padding mask of the packed stream applies as well
        valid_k = valid_k & pad_packed(call.key_mask.unsqueeze(-1), cu_k)[0].squeeze(-1)
    pos = cpos = None
    if m.rope is not None:
        if m.positions is not None:
            check_positions(m.positions, call.B, call.M, m.two_d, "positions")
            pos = unpack_positions(m.positions, call.M, cq, m.two_d)
        if m.context_positions is not None:
            check_positions(m.context_positions, call.B, call.N, m.two_d, "context_positions")
            cpos = unpack_positions(m.context_positions, call.N, cu_k, m.two_d)
        elif self_mix:
            cpos = pos
    rows = replace(call, x=xs, context=None if self_mix else cs, key_mask=valid_k, mask=None, cu_q=None, cu_k=None,
                   B=xs.shape[0], M=xs.shape[1], N=cs.shape[1], squeeze=False,
                   mixing=m.with_(mask=valid_k, cu_seqlens=None, positions=pos, context_positions=cpos))
    return rows, valid_q


# ----------------------------------------------------------------------------------------------------------------
# the gated form's decay
# ----------------------------------------------------------------------------------------------------------------


def decay_logs(x: Tensor, weight: Tensor, bias: Tensor, key_mask: Optional[Tensor]) -> Tensor:
    """(B, H, N) log-decays g = −softplus(W_a x + b) ≤ 0; 0 (no decay) at padding tokens."""
    g = -F.softplus(F.linear(x, weight, bias).float() if x.dtype in (torch.float16, torch.bfloat16) else
                    F.linear(x, weight, bias))
    if key_mask is not None:
        g = g * key_mask.unsqueeze(-1).to(g.dtype)
    return g.transpose(1, 2)


def sequence_ids(cu: Tensor, T: int) -> Tensor:
    """(1, T) int64: each packed token's sequence index."""
    cu64 = cu.to(torch.int64)
    return torch.searchsorted(cu64[1:], torch.arange(T, device=cu.device), right=True).unsqueeze(0)


def gated_features(call: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Optional[Tensor]]:
    """The gated call's (q, k, v, log-decays g (B, H, N), z_s, packed sequence ids (1, T) or None): self-mixing
    only, the token shift restarting at each packed sequence, default rotary positions counting within it."""
    m = call.mixing
    x, N = call.x, call.N
    seq = starts = None
    if call.cu_k is not None:
        seq = sequence_ids(call.cu_k, N)
        starts = torch.cat([seq.new_ones(1, 1, dtype=torch.bool), seq[:, 1:] != seq[:, :-1]], dim=1)
    phi, v, psi, zs, _ = value_features(x, x, *_weights(call), call.dv, call.shift_weight, call.key_mask, None, True,
                                        m.activation, starts)
    w = call.key_mask.to(phi.dtype) if call.key_mask is not None else None
    k = heads_view(phi if w is None else phi * w.unsqueeze(-1), call.heads)
    q, vh = heads_view(psi, call.heads), heads_view(v, call.heads)
    if m.rope is not None:
        pos = m.positions
        if pos is None and seq is not None and not m.two_d:
            ar = torch.arange(N, device=x.device)
            pos = ar - torch.cummax(torch.where(starts[0], ar, 0), dim=0).values
        pos = positions_or_default(pos, call.B, N, m.two_d, "positions", x.device)
        k, q = rotate_heads(k, pos, m.rope_base, m.two_d), rotate_heads(q, pos, m.rope_base, m.two_d)
    g = decay_logs(x, call.decay_weight, call.decay_bias, call.key_mask).to(phi.dtype)
    return q, k, vh, g, zs, seq


# a gated scan: (q, k, v, g, segment ids or None, chunk, carried-in state or None) → (o, final state or None)
Scan = Callable[..., Tuple[Tensor, Optional[Tensor]]]


def mix_both_ways(scan: Scan, q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, causal: bool,
                  block_size: Optional[int], seq: Optional[Tensor] = None, chunk: int = CHUNK,
                  state: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """The gated mixing of every mode with a backend's own ``scan``: (o (B, H, N, E), the forward state after the
    last token). Causal: the forward scan. Full and block-causal: plus a backward scan over the later tokens of each
    query's sequence (full) or block (block-causal), less the diagonal both count.

    ``seq`` (B, N): sequence ids of packed tokens (the scans restart between sequences), or None."""
    N = q.shape[2]
    o, final = scan(q, k, v, g, seq, chunk, state)
    if causal and block_size is None:
        return o, final
    # the backward scan: the later tokens of each query's block (block-causal) or sequence (full), exclusive
    seg = seq if seq is not None else torch.zeros(q.shape[0], N, dtype=torch.long, device=q.device)
    if causal:
        pos = torch.arange(N, device=q.device)
        if seq is not None:  # blocks count from each packed sequence's first token
            starts = torch.cat([torch.ones_like(seg[:, :1], dtype=torch.bool), seg[:, 1:] != seg[:, :-1]], 1)
            first = torch.cummax(torch.where(starts, pos, 0), dim=1).values
            pos = pos - first
        seg = seg * (N + 1) + torch.div(pos, block_size, rounding_mode="floor")
    ob, _ = scan(q.flip(2), k.flip(2), v.flip(2), reverse_logs(g), seg.flip(1), chunk, None)
    diag = (q * k).sum(-1, keepdim=True) * v  # the scans both count j = i
    return o + ob.flip(2) - diag, final
