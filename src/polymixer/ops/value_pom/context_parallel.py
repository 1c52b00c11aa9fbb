"""The value-carrying PoM under context parallelism (:mod:`polymixer.ops.parallel`).

The same decomposition as PoM's (:mod:`polymixer.ops.pom.context_parallel`) with the (B, heads, D/h, dv/h)
states in place of the (B, D) sums: full mixing all-reduces every rank's state; causal mixing starts this slice's
chunked mixing from the states of the ranks before it; block-causal mixing aligns the slice to the global blocks
(zero-weight tokens in front), starts from the same prefix and adds, for the queries of the block that runs past the
slice, the next ranks' states of that block. The token shift / short convolution of width W reads the W − 1
projections before the slice's first token: each rank sends its last W − 1 (masked) key / value projections — a
halo — to the ranks that read them, point to point. A stream's state (a causal prefill) is one more prefix.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..call import Call, PoMState
from ..features import call_features, value_output
from ..parallel import ContextParallel, Slice, all_reduce_sum, block_carry, exclusive_scan, halo_before
from ..pom.context_parallel import agree_on_call
from .modular import value_mix

__all__ = ["forward"]


def _halo(x: Tensor, in_weight: Tensor, rows: int, key_mask: Optional[Tensor], lags: int, sl: Slice,
          cp: ContextParallel, prev: Optional[Tensor]) -> Tensor:
    """The ``lags`` key / value projections before this slice's first token (B, lags, D + dv), oldest first."""
    n = x.shape[1]
    take = min(lags, n)
    z = F.linear(x[:, n - take:], in_weight[:rows])
    if key_mask is not None:
        z = z * key_mask[:, n - take:, None].to(z.dtype)
    return halo_before(z, lags, sl, cp, "value-pom token-shift halo", prev)


def _features(call: Call, sl: Slice, cp: ContextParallel) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(k, q, v per head, key weights (B, n), gate pre-activations, the last W − 1 projections) of this slice: the
    token shift reads the halo before the slice (one collective), rotary the global positions."""
    x, w, state = call.x, call.weights, call.state
    prev = None
    if w.shift_weight is not None:
        prev = _halo(x, w.in_weight, call.D + call.dv, call.key_mask, w.shift_weight.shape[0] - 1, sl, cp,
                     None if state is None else state.prev)
    positions = sl.start + torch.arange(call.N, device=x.device)  # the global index (after the stream's)
    if state is not None:
        positions = state.offset.unsqueeze(1) + positions
    (q, k, vh, wt, zs), last = call_features(call, positions, prev=prev,
                                             dtype=None if state is None else state.sum.dtype)
    return k, q, vh, wt, zs, last


def _mix_states(q: Tensor, k: Tensor, vh: Tensor, w: Tensor, call: Call, sl: Slice, cp: ContextParallel
                ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(o, counts, state after the slice, count after it): full mixing sums every rank's state; causal mixing
    starts from the states of the ranks before (and the stream's), one collective either way."""
    B, n = w.shape
    block, state = call.block_size, call.state
    total = torch.einsum("bhnd,bhne->bhde", k, vh)  # this slice's state (B, H, D_h, dv_h)
    X = total[0].numel()
    flat = torch.cat([total.reshape(B, X), w.sum(1, keepdim=True)], dim=1)  # (B, X + 1): state and count
    if not call.causal:
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
    if state is not None:
        prefix = prefix + torch.cat([state.sum.reshape(B, X).to(prefix.dtype),
                                     state.count.to(prefix.dtype).unsqueeze(1)], dim=1)
    S0, c0 = prefix[:, :X].view_as(total), prefix[:, X]
    if block is None:
        return value_mix(q, k, vh, w, causal=True, chunk=call.chunk, state=S0, count=c0)
    return _block_causal(q, k, vh, w, block, call.chunk, S0, c0, tail, sl)


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


def forward(call: Optional[Call], problem: Optional[str], cp: ContextParallel) -> Tuple[Tensor, Optional[PoMState]]:
    """:func:`polymixer.ops.value_pom.value_pom` on this rank's slice of every sequence: (y, the stream's state after
    this slice — the whole prefix's on the last rank — or None without a stream). A call that cannot be split
    (``problem``; ``call`` None when it failed its own checks) is refused alike on every rank: never a hang."""
    sl = agree_on_call(call, problem, cp, "value pom", lambda c: {
        "D": c.D, "dv": c.dv, "heads": c.heads, "chunk": c.chunk,
        "shift width": 0 if c.weights.shift_weight is None else c.weights.shift_weight.shape[0]})
    k, q, vh, w, zs, last = _features(call, sl, cp)
    o, o_cnt, final_state, final_count = _mix_states(q, k, vh, w, call, sl, cp)
    y, state = value_output(o, o_cnt, zs, call.weights, call.mixing), call.state
    if state is None:
        return y, None
    return y, PoMState(final_state.to(state.sum.dtype), final_count.to(state.count.dtype), state.offset + sl.total,
                       last.to(state.prev.dtype))
