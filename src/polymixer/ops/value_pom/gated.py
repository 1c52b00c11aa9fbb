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
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import ActivationLike, CuSeqlens, batch_packed, check_mix_inputs, triton_possible
from ..features import gate_mix, reverse_logs
from .modular import (CHUNK, EPS, check_layout, check_rope, heads_view, positions_or_default, rotate_heads,
                      value_features)

__all__ = ["decay_logs", "gated_scan", "gated_mix", "gated_value_pom", "gated_value_pom_step", "retnet_bias",
           "reference_gated"]


def retnet_bias(heads: int) -> Tensor:
    """Decay biases whose initial per-head decay is RetNet's γ_h = 1 − 2^(−5−h): softplus(b_h) = −log γ_h."""
    gamma = 1.0 - 2.0 ** (-5.0 - torch.arange(heads, dtype=torch.float64))
    return torch.log(torch.expm1(-torch.log(gamma))).float()


def decay_logs(x: Tensor, weight: Tensor, bias: Tensor, key_mask: Optional[Tensor]) -> Tensor:
    """(B, H, N) log-decays g = −softplus(W_a x + b) ≤ 0; 0 (no decay) at padding tokens."""
    g = -F.softplus(F.linear(x, weight, bias).float() if x.dtype in (torch.float16, torch.bfloat16) else
                    F.linear(x, weight, bias))
    if key_mask is not None:
        g = g * key_mask.unsqueeze(-1).to(g.dtype)
    return g.transpose(1, 2)


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
              scan: Optional[Callable[..., Tuple[Tensor, Optional[Tensor]]]] = None) -> Tuple[Tensor, Tensor]:
    """The mixing of every mode: (o (B, H, N, E), the forward state after the last token).

    ``seq`` (B, N): sequence ids of packed tokens (the scans restart between sequences), or None. ``scan``: the
    scan's implementation (:func:`gated_scan`, or the Triton kernels' with the same arguments)."""
    N = q.shape[2]
    scan = gated_scan if scan is None else scan
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


def _kernels(q: Tensor, chunk: int) -> Optional[Callable[..., Tuple[Tensor, Optional[Tensor]]]]:
    """The Triton scan for CUDA tensors it can take (fp32 / bf16 / fp16, a power-of-two chunk ≥ 16, heads ≤ 128
    channels); None: the torch form."""
    if (not q.is_cuda or q.dtype not in (torch.float32, torch.bfloat16, torch.float16) or chunk < 16
            or chunk & (chunk - 1) or q.shape[-1] > 128 or not triton_possible()):
        return None
    from .gated_triton import triton_gated_scan

    return triton_gated_scan


def _readout(o: Tensor, zs: Tensor, gate_bias: Tensor, norm_weight: Tensor, out_weight: Tensor,
             out_bias: Optional[Tensor], gate: ActivationLike) -> Tensor:
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + EPS)
    B, H, M, e = o.shape
    h = o.transpose(1, 2).reshape(B, M, H * e) * norm_weight.to(o.dtype)
    return F.linear(gate_mix(zs, gate_bias, h, gate), out_weight, out_bias)


def _sequence_ids(cu: Tensor, T: int) -> Tensor:
    cu64 = cu.to(torch.int64)
    return torch.searchsorted(cu64[1:], torch.arange(T, device=cu.device), right=True).unsqueeze(0)


def gated_value_pom(x: Tensor, context: Optional[Tensor], in_weight: Tensor, gate_bias: Tensor, coeff: Tensor,
                    coeff_q: Tensor, shift_weight: Optional[Tensor], norm_weight: Tensor, out_weight: Tensor,
                    out_bias: Optional[Tensor], decay_weight: Tensor, decay_bias: Tensor, *, heads: int = 1,
                    mask: Optional[Tensor] = None, causal: bool = False, block_size: Optional[int] = None,
                    cu_seqlens: Optional[CuSeqlens] = None, positions: Optional[Tensor] = None,
                    context_positions: Optional[Tensor] = None, activation: ActivationLike = "leaky_clamp",
                    gate: ActivationLike = "hardsigmoid", reduction: str = "mean", rope: Optional[str] = None,
                    rope_base: float = 10000.0, chunk: int = CHUNK) -> Tensor:
    """The gated value-carrying PoM (module docstring): the value PoM's arguments plus ``decay_weight`` (H, d) and
    ``decay_bias`` (H,). ``reduction`` is accepted for the common signature (the readout's RMSNorm makes it moot)."""
    from ..parallel import active

    if active() is not None:
        raise NotImplementedError("the gated value PoM has no context-parallel form yet (its decayed states would "
                                  "need a decayed prefix across ranks): mix it outside polymixer.context_parallel")
    d = out_weight.shape[0]
    D, dv = check_layout(in_weight, coeff, coeff_q, out_weight, heads)
    check_rope(rope, D, heads)
    if context is not None or context_positions is not None:
        raise ValueError("the gated value PoM mixes a sequence with itself: its decay needs the tokens' order "
                         "(cross-mixing is not supported)")
    if decay_weight.shape != (heads, d) or decay_bias.shape != (heads,):
        raise ValueError(f"decay_weight must be ({heads}, {d}) and decay_bias ({heads},), got "
                         f"{tuple(decay_weight.shape)} and {tuple(decay_bias.shape)}")
    x, _, squeeze = batch_packed(x, None, cu_seqlens)
    B, M, N, key_mask, general, cu_q, cu_k = check_mix_inputs(x, None, d, mask, causal, block_size, cu_seqlens)
    if general is not None:
        raise ValueError("the gated value PoM takes key padding, causal, block-causal and packed masking; an "
                         "explicit (B, M, N) mask is not supported")
    seq = starts = None
    if cu_k is not None:
        seq = _sequence_ids(cu_k, N)
        starts = torch.cat([seq.new_ones(1, 1, dtype=torch.bool), seq[:, 1:] != seq[:, :-1]], dim=1)
    phi, v, psi, zs, _ = value_features(x, x, in_weight, coeff, coeff_q, dv, shift_weight, key_mask, None, True,
                                        activation, starts)
    w = key_mask.to(phi.dtype) if key_mask is not None else None
    k = heads_view(phi if w is None else phi * w.unsqueeze(-1), heads)
    q, vh = heads_view(psi, heads), heads_view(v, heads)
    if rope is not None:
        two_d = rope == "2d"
        pos = positions
        if pos is None and seq is not None and not two_d:
            ar = torch.arange(N, device=x.device)
            pos = ar - torch.cummax(torch.where(starts[0], ar, 0), dim=0).values
        pos = positions_or_default(pos, B, N, two_d, "positions", x.device)
        k, q = rotate_heads(k, pos, rope_base, two_d), rotate_heads(q, pos, rope_base, two_d)
    g = decay_logs(x, decay_weight, decay_bias, key_mask).to(phi.dtype)
    o, _ = gated_mix(q, k, vh, g, causal=causal, block_size=block_size, seq=seq, chunk=chunk,
                     scan=_kernels(q, chunk))
    y = _readout(o, zs, gate_bias, norm_weight, out_weight, out_bias, gate)
    return y.squeeze(0) if squeeze else y


def gated_value_pom_step(x: Tensor, state: Tensor, count: Tensor, offset: Tensor, prev: Tensor, in_weight: Tensor,
                         gate_bias: Tensor, coeff: Tensor, coeff_q: Tensor, shift_weight: Optional[Tensor],
                         norm_weight: Tensor, out_weight: Tensor, out_bias: Optional[Tensor], decay_weight: Tensor,
                         decay_bias: Tensor, *, heads: int = 1, causal: bool = True, mask: Optional[Tensor] = None,
                         positions: Optional[Tensor] = None, activation: ActivationLike = "leaky_clamp",
                         gate: ActivationLike = "hardsigmoid", reduction: str = "mean", rope: Optional[str] = None,
                         rope_base: float = 10000.0, chunk: int = CHUNK
                         ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Streaming (causal): a chunk (B, T, d) after ``state``; returns (y, state, count, offset, prev). O(1) state."""
    if not causal:
        raise ValueError("the gated value PoM streams causally (a block would need its later tokens)")
    D, dv = check_layout(in_weight, coeff, coeff_q, out_weight, heads)
    B, T, _ = x.shape
    acc = state.dtype
    phi, v, psi, zs, last = value_features(x, x, in_weight, coeff, coeff_q, dv, shift_weight, mask, prev, True,
                                           activation)
    phi, v, psi = phi.to(acc), v.to(acc), psi.to(acc)
    k = heads_view(phi if mask is None else phi * mask.unsqueeze(-1).to(acc), heads)
    q, vh = heads_view(psi, heads), heads_view(v, heads)
    if rope is not None:
        two_d = rope == "2d"
        if positions is None and two_d:
            raise ValueError("2-D rotary streaming needs explicit positions of shape (B, T, 2) or (T, 2)")
        pos = positions_or_default(positions, B, T, two_d, "positions", x.device, offset)
        k, q = rotate_heads(k, pos, rope_base, two_d), rotate_heads(q, pos, rope_base, two_d)
    g = decay_logs(x, decay_weight, decay_bias, mask).to(acc)
    o, new_state = gated_scan(q, k, vh, g, None, chunk, state)
    y = _readout(o, zs, gate_bias, norm_weight, out_weight, out_bias, gate)
    seen = T if mask is None else mask.to(count.dtype).sum(1)
    return y, new_state, count + seen, offset + T, last.to(prev.dtype)


def reference_gated(x: Tensor, in_weight: Tensor, gate_bias: Tensor, coeff: Tensor, coeff_q: Tensor,
                    shift_weight: Optional[Tensor], norm_weight: Tensor, out_weight: Tensor, out_bias: Optional[Tensor],
                    decay_weight: Tensor, decay_bias: Tensor, *, heads: int = 1, mask: Optional[Tensor] = None,
                    causal: bool = False, block_size: Optional[int] = None, activation: str = "leaky_clamp",
                    gate: str = "hardsigmoid", rope: Optional[str] = None, rope_base: float = 10000.0,
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
    return _readout(o, zs.double(), gate_bias.double(), norm_weight.double(), out_weight.double(), f64(out_bias),
                    gate)

