"""The value-carrying PoM under context parallelism (:mod:`polymixer.ops.parallel`).

The same decomposition as PoM's (:mod:`polymixer.ops.pom.context_parallel`) with the (B, heads, D/h, dv/h)
states in place of the (B, D) sums: full mixing all-reduces every rank's state; causal mixing starts this slice's
chunked mixing from the states of the ranks before it; block-causal mixing aligns the slice to the global blocks
(zero-weight tokens in front), starts from the same prefix and adds, for the queries of the block that runs past the
slice, the next ranks' states of that block. The token shift / short convolution of width W reads the W − 1
projections before the slice's first token: each rank sends its last W − 1 (masked) key / value projections — a
halo — to the ranks that read them, point to point.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import Mixing, check_positions
from ..parallel import (ContextParallel, Slice, agree, all_reduce_sum, block_carry, exclusive_scan, halo_before,
                        mode_facts, tensor_facts)
from .call import ValueWeights, make_value_call
from .features import heads_view, rotate_heads, value_features, value_output
from .modular import value_mix

__all__ = ["forward", "step"]

# a stream's state before this slice: (state, count, offset, prev)
Stream = Tuple[Tensor, Tensor, Tensor, Tensor]


def _validate(x: Tensor, context: Optional[Tensor], weights: ValueWeights, mixing: Mixing, heads: int, chunk: int,
              stream: bool) -> Tuple[int, int, Optional[Tensor]]:
    """(D, dv, key mask) of a call that can be split — the value PoM's own checks
    (:func:`polymixer.ops.value_pom.call.make_value_call`) and those of splitting —, else a ValueError saying why."""
    if not stream:
        if context is not None:
            raise ValueError("cross-mixing cannot be split: pass the whole context on every rank")
        if mixing.cu_seqlens is not None:
            raise ValueError("packed sequences (cu_seqlens) cannot be split across ranks: give each rank a padded "
                             "batch slice")
    call = make_value_call(x, None, weights, mixing, heads, chunk)
    if call.mask is not None:
        raise ValueError("an explicit (B, M, N) mask cannot be split: use key padding, causal or block-causal masking")
    if mixing.rope == "2d" and mixing.positions is None:
        raise ValueError("2-D rotary needs this slice's explicit (row, col) positions")
    return call.D, call.dv, call.key_mask


def _halo(x: Tensor, in_weight: Tensor, rows: int, key_mask: Optional[Tensor], lags: int, sl: Slice,
          cp: ContextParallel, prev: Optional[Tensor]) -> Tensor:
    """The ``lags`` key / value projections before this slice's first token (B, lags, D + dv), oldest first."""
    n = x.shape[1]
    take = min(lags, n)
    z = F.linear(x[:, n - take:], in_weight[:rows])
    if key_mask is not None:
        z = z * key_mask[:, n - take:, None].to(z.dtype)
    return halo_before(z, lags, sl, cp, "value-pom token-shift halo", prev)


def _agree(x: Tensor, context: Optional[Tensor], weights: ValueWeights, mixing: Mixing, heads: int, chunk: int,
           cp: ContextParallel, problem: Optional[str], stream: bool) -> Tuple[int, int, Optional[Tensor], Slice]:
    """(D, dv, key mask, this rank's slice) once every rank has checked its call and they agree on the mode (one
    collective, :func:`polymixer.ops.parallel.agree`); else the same ValueError on every rank."""
    D = dv = 0
    key_mask = None
    if problem is None:
        try:
            D, dv, key_mask = _validate(x, context, weights, mixing, heads, chunk, stream)
        except (ValueError, TypeError) as e:
            problem = str(e)
    _, _, _, _, shift, _, _, _ = weights
    n = x.shape[1] if isinstance(x, Tensor) and x.dim() == 3 else 0
    causal = True if stream else bool(mixing.causal)
    block = None if stream else mixing.block_size
    facts = {"length": n}
    if not problem:
        facts.update({"batch": x.shape[0], "width": x.shape[-1], "D": D, "dv": dv, "heads": heads,
                      "chunk": chunk, "shift width": 0 if shift is None else shift.shape[0], **tensor_facts(x)})
        facts.update(mode_facts(causal, block, key_mask, mixing.rope, mixing.positions, stream))
    return D, dv, key_mask, Slice(cp.rank, agree(cp, "value pom", facts, problem))


def _features(x: Tensor, weights: ValueWeights, mixing: Mixing, heads: int, D: int, dv: int,
              key_mask: Optional[Tensor], sl: Slice, cp: ContextParallel, stream: Optional[Stream]
              ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(k, q, v per head, key weights (B, n), gate pre-activations, the last W − 1 projections) of this slice: the
    token shift reads the halo before the slice (one collective), rotary the global positions."""
    in_weight, _, coeff, coeff_q, shift, _, _, _ = weights
    B, n = x.shape[0], x.shape[1]
    state_in = offset = prev_in = None
    if stream is not None:
        state_in, _, offset, prev_in = stream
    prev = None
    if shift is not None:
        prev = _halo(x, in_weight, D + dv, key_mask, shift.shape[0] - 1, sl, cp, prev_in)
    phi, v, psi, zs, last = value_features(x, x, in_weight, coeff, coeff_q, dv, shift, key_mask, prev, True,
                                           mixing.activation)
    if state_in is not None:
        acc = state_in.dtype
        phi, v, psi = phi.to(acc), v.to(acc), psi.to(acc)
    w = key_mask.to(phi.dtype) if key_mask is not None else phi.new_ones(B, n)
    k, q, vh = heads_view(phi * w.unsqueeze(-1), heads), heads_view(psi, heads), heads_view(v, heads)
    if mixing.rope is not None:
        two_d = mixing.two_d
        pos = mixing.positions
        if pos is None:
            pos = sl.start + torch.arange(n, device=x.device)
            if offset is not None:
                pos = offset.unsqueeze(1) + pos
        check_positions(pos, B, n, two_d, "positions")
        k, q = rotate_heads(k, pos, mixing.rope_base, two_d), rotate_heads(q, pos, mixing.rope_base, two_d)
    return k, q, vh, w, zs, last


def _mix_states(q: Tensor, k: Tensor, vh: Tensor, w: Tensor, causal: bool, block: Optional[int], chunk: int,
                sl: Slice, cp: ContextParallel, stream: Optional[Stream]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(o, counts, state after the slice, count after it): full mixing sums every rank's state; causal mixing
    starts from the states of the ranks before (and the stream's), one collective either way."""
    B, n = w.shape
    total = torch.einsum("bhnd,bhne->bhde", k, vh)  # this slice's state (B, H, D_h, dv_h)
    X = total[0].numel()
    flat = torch.cat([total.reshape(B, X), w.sum(1, keepdim=True)], dim=1)  # (B, X + 1): state and count
    if not causal:
        allsum = all_reduce_sum(flat, cp, "value-pom full states")
        S, cnt_all = allsum[:, :X].view_as(total), allsum[:, X]
        o = torch.einsum("bhmd,bhde->bhme", q, S)
        return o, cnt_all.unsqueeze(1).expand(B, n), S, cnt_all
    tail = None
    if block is None:
        prefix = exclusive_scan(flat, cp, "value-pom causal states")
    else:
        head_len = min(n, block - sl.start % block)
        head = torch.cat([torch.einsum("bhnd,bhne->bhde", k[:, :, :head_len], vh[:, :, :head_len]).reshape(B, X),
                          w[:, :head_len].sum(1, keepdim=True)], dim=1)
        prefix, tail = block_carry(flat, head, sl, block, cp, "value-pom block-causal states")
    state_in, count_in = (None, None) if stream is None else stream[:2]
    if state_in is not None:
        prefix = prefix + torch.cat([state_in.reshape(B, X).to(prefix.dtype),
                                     count_in.to(prefix.dtype).unsqueeze(1)], dim=1)
    S0, c0 = prefix[:, :X].view_as(total), prefix[:, X]
    if block is None:
        return value_mix(q, k, vh, w, causal=True, chunk=chunk, state=S0, count=c0)
    return _block_causal(q, k, vh, w, block, chunk, S0, c0, tail, sl)


def _block_causal(q: Tensor, k: Tensor, vh: Tensor, w: Tensor, block: int, chunk: int, S0: Tensor, c0: Tensor,
                  tail: Tensor, sl: Slice) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Block-causal :func:`_mix_states` from the prefix (``S0``, ``c0``): the slice aligned to the global blocks by
    zero-weight tokens in front; the queries of the block that runs past the slice also read the next ranks' part
    of that block (``tail``: their state and count of that block, (B, X + 1); zeros where no rank follows in it)."""
    n = w.shape[1]
    X = S0[0].numel()
    lead = sl.start % block
    kp, qp, vp = (F.pad(t, (0, 0, lead, 0)) for t in (k, q, vh))
    o, o_cnt, final_state, final_count = value_mix(qp, kp, vp, F.pad(w, (lead, 0)), causal=True, block_size=block,
                                                   chunk=chunk, state=S0, count=c0)
    o, o_cnt = o[:, :, lead:], o_cnt[:, lead:]
    gi = sl.start + torch.arange(n, device=q.device)
    past = ((torch.div(gi, block, rounding_mode="floor") + 1) * block > sl.start + n).to(o.dtype)
    # added on every rank, zeros or not: the tail's transfers have a backward every rank must reach
    o = o + past.view(1, 1, n, 1) * torch.einsum("bhmd,bhde->bhme", q, tail[:, :X].view_as(S0))
    o_cnt = o_cnt + past.unsqueeze(0) * tail[:, X:]
    return o, o_cnt, final_state, final_count


def _mix(x: Tensor, context: Optional[Tensor], weights: ValueWeights, mixing: Mixing, heads: int, chunk: int,
         cp: ContextParallel, problem: Optional[str], stream: Optional[Stream]
         ) -> Tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """(y, state after this slice, count after it, the last W − 1 projections, the global length)."""
    D, dv, key_mask, sl = _agree(x, context, weights, mixing, heads, chunk, cp, problem, stream is not None)
    _, gate_bias, _, _, _, norm_weight, out_weight, out_bias = weights
    causal = True if stream is not None else bool(mixing.causal)
    block = None if stream is not None else mixing.block_size
    k, q, vh, w, zs, last = _features(x, weights, mixing, heads, D, dv, key_mask, sl, cp, stream)
    o, o_cnt, final_state, final_count = _mix_states(q, k, vh, w, causal, block, chunk, sl, cp, stream)
    y = value_output(o, o_cnt, zs, gate_bias, norm_weight, out_weight, out_bias, mixing.reduction, mixing.gate)
    return y, final_state, final_count, last, sl.total


def forward(x: Tensor, context: Optional[Tensor], weights: ValueWeights, mixing: Mixing, heads: int, chunk: int,
            cp: ContextParallel) -> Tensor:
    """:func:`polymixer.ops.value_pom.value_pom` on this rank's slice of every sequence (a call that cannot be split
    is refused alike on every rank: never a hang)."""
    return _mix(x, context, weights, mixing, heads, chunk, cp, None, None)[0]


def step(x: Tensor, stream: Stream, weights: ValueWeights, mixing: Mixing, heads: int, chunk: int,
         cp: ContextParallel) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """A context-parallel prefill of a causal stream (``stream``: the (state, count, offset, prev) before it): (y,
    state, count, offset, prev) after this rank's slice — the whole prefix's on the last rank, where decoding
    continues."""
    problem = None
    if not mixing.causal:
        problem = "value_pom_step under context_parallel streams causally only (frames are not split)"
    y, state, count, last, n_total = _mix(x, None, weights, mixing.with_(causal=True), heads, chunk, cp, problem,
                                          stream)
    state0, count0, offset0, prev0 = stream
    return y, state.to(state0.dtype), count.to(count0.dtype), offset0 + n_total, last.to(prev0.dtype)
