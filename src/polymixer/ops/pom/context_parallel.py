"""PoM under context parallelism (:mod:`polymixer.ops.parallel`): this rank's slice of every sequence, mixed exactly
as the whole sequence would be, with (B, D + 1)-sized transfers whose number grows as log P at most.

For the slice [a, b) of a sequence, the aggregate a query i sees is
  full          the total over every rank (one all-reduce of each rank's sum and count),
  causal        the sum over the ranks before this one (an exclusive scan over the ranks) + the local running sum,
  block-causal  the same prefix + the local running sum up to the end of i's block or of the slice; the queries of
                the block that runs past b add, from each next rank that starts inside that block, its tokens of
                that block (its first block): :func:`polymixer.ops.parallel.block_carry`.
Counts travel with the sums (key padding weighs both). Rotary positions default to the global token index a + i.
The transfers are started as soon as this slice's sums are known and the local running sums are computed while
they are in flight. The gradients flow back through them (each transfer's backward is its transpose), so the input
gradient of every row and the sum over ranks of the parameter gradients equal those of the unsharded call.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..call import Call, PoMState, refuse_split
from ..common import compute_dtype, is_compiling, rope_angles
from ..features import cumsum, poly_features, rotate_features, safe_inverse, select
from ..parallel import (ContextParallel, Slice, agree, all_reduce_sum, block_carry, causal_sums, exclusive_scan,
                        mode_facts, tensor_facts)
from .fused_cpu import mix_with_carry, slice_sum

__all__ = ["forward", "agree_on_call"]


def _global_positions(call: Call, sl: Slice) -> Tensor:
    """A slice's rotary positions: its own, else the global token index (after a stream's offset)."""
    pos = sl.start + torch.arange(call.N, device=call.x.device)
    return call.rope_positions(pos if call.state is None else call.state.offset.unsqueeze(1) + pos)[0]


def forward(call: Optional[Call], problem: Optional[str], cp: ContextParallel) -> Tuple[Tensor, Optional[PoMState]]:
    """(y (B, n, d), the stream's state after this rank's last token — the whole prefix's on the last rank — or None
    without a stream). ``call.state``: a stream's state before the global sequence (causal only), or None. A call
    that cannot be split (``problem``; ``call`` None when it failed its own checks) is refused alike on every rank:
    never a hang."""
    if call is not None and call.weights.shift_weight is not None:
        problem = "a PoM's token shift is not split across ranks: run it without context_parallel"
    sl = agree_on_call(call, problem, cp, "pom", lambda c: {"D": c.D, "gate width": c.Ds})
    x, D, B, n, state = call.x, call.D, call.B, call.N, call.state
    if _fusable(call):
        return _fused(call, cp, sl, state)

    w = call.weights
    z = F.linear(x, w.in_weight)
    zh, zs = z.split([D, call.Ds], dim=-1)
    p = poly_features(zh, w.coeff, call.activation)  # (B, n, D), accumulation dtype
    pos = _global_positions(call, sl) if call.rope is not None else None
    p = rotate_features(p, pos, call.mixing)
    kw = call.key_mask.to(p.dtype) if call.key_mask is not None else p.new_ones(B, n)
    p = p * kw.unsqueeze(-1)
    pc = torch.cat([p, kw.unsqueeze(-1)], dim=-1)  # the sums and their counts travel together: (B, n, D + 1)
    h, final = _sums(call, cp, sl, pc, state)
    hs, cnt = h[..., :D], h[..., D:]
    if call.reduction == "mean":
        hs = hs * safe_inverse(cnt)
    g = select(zs, w.gate_bias, hs, call.mixing, pos)
    return F.linear(g, w.out_weight, w.out_bias), _after(call, final, sl)


def agree_on_call(call: Optional[Call], problem: Optional[str], cp: ContextParallel, op: str,
                  facts: Callable[[Call], Dict[str, int]]) -> Slice:
    """This rank's slice of a call of ``op`` once every rank has checked its call (``problem``: why it failed its
    checks, ``call`` None then; else :func:`~polymixer.ops.call.refuse_split`'s reason) and they agree on its sizes,
    the op's own ``facts(call)`` and its mode — one collective, :func:`polymixer.ops.parallel.agree`; else the same
    ValueError on every rank."""
    problem = problem or refuse_split(call)
    found = {"length": 0 if call is None else call.N}
    if not problem:
        found.update({"batch": call.B, "width": call.x.shape[-1], **facts(call), **tensor_facts(call.x)})
        found.update(mode_facts(call.causal, call.block_size, call.key_mask, call.rope, call.positions,
                                call.state is not None))
    return Slice(cp.rank, agree(cp, op, found, problem))


def _after(call: Call, final: Tensor, sl: Slice) -> Optional[PoMState]:
    """The stream's state after the global sequence's tokens up to this slice's last one (``final``: their
    (B, D + 1) sums and counts, the stream's before them included), or None without a stream."""
    state, D = call.state, call.D
    if state is None:
        return None
    return PoMState(final[:, :D].to(state.sum.dtype), final[:, D].to(state.count.dtype), state.offset + sl.total)


def _sums(call: Call, cp: ContextParallel, sl: Slice, pc: Tensor, state: Optional[PoMState]
          ) -> Tuple[Tensor, Tensor]:
    """(the sums and counts each query reads (B, n or 1, D + 1), those after this slice (B, D + 1)) from this
    slice's weighted features and counts ``pc`` (B, n, D + 1) and what the other ranks send."""
    local = pc.sum(1)
    if not call.causal:
        total = all_reduce_sum(local, cp, "pom full sums")
        return total.unsqueeze(1), total
    K, n = call.block_size, call.N
    if K is None:  # the local running sums (B, n, D + 1) computed while the prefix travels
        prefix, run = causal_sums(pc, cp, "pom causal sums")
    else:
        run = cumsum(pc)
        head = run[:, min(n, K - sl.start % K) - 1]  # this rank's sums over its tokens of its first block
        prefix, tail = block_carry(local, head, sl, K, cp, "pom block-causal sums")
        gi = sl.start + torch.arange(n, device=pc.device)
        end = (torch.div(gi, K, rounding_mode="floor") + 1) * K  # one past the last token i's block sees
        run = run.index_select(1, (torch.clamp(end, max=sl.start + n) - 1 - sl.start).clamp(min=0))
        past = (end > sl.start + n).to(pc.dtype)  # the queries whose block runs past this slice read the tail
        run = run + past.view(1, n, 1) * tail.unsqueeze(1)
    if state is not None:
        prefix = prefix + torch.cat([state.sum.to(pc.dtype), state.count.to(pc.dtype).unsqueeze(-1)], dim=-1)
    return prefix.unsqueeze(1) + run, prefix + local


def _fusable(call: Call) -> bool:
    """Calls the fused CPU path takes (causal or full, no key padding, relative rotary): there the slice keeps its
    memory to z."""
    return (call.x.device.type == "cpu" and call.key_mask is None and call.block_size is None
            and isinstance(call.activation, str) and isinstance(call.gate, str) and not is_compiling()
            and (call.rope is None or call.rope_convention == "relative"))


def _fused(call: Call, cp: ContextParallel, sl: Slice, state: Optional[PoMState]
           ) -> Tuple[Tensor, Optional[PoMState]]:
    """The fused CPU path with what the other ranks contribute carried in: one tiled pass sums this slice, one
    all-gather, one tiled pass mixes (saving only z, as the fused path does)."""
    x, D, B, n, w = call.x, call.D, call.B, call.N, call.weights
    cd = compute_dtype(x.dtype)
    rot = None
    if call.rope is not None:
        pos = _global_positions(call, sl)
        rot = rope_angles(pos, D, call.rope_base, call.rope == "2d", cd)
    z = F.linear(x, w.in_weight)
    local = slice_sum(z, w.coeff, rot, call.activation)
    counts = torch.full((B, 1), float(n), dtype=cd, device=x.device)
    mine = torch.cat([local, counts], dim=1)  # (B, D + 1)
    if call.causal:
        before = exclusive_scan(mine, cp, "pom causal sums")
        if state is not None:
            before = before + torch.cat([state.sum.to(cd), state.count.to(cd).unsqueeze(-1)], dim=1)
        carry, count = before[:, :D], before[:, D].detach()
        final = before + mine
    else:
        final = all_reduce_sum(mine, cp, "pom full sums")
        others = final - mine  # what the other ranks hold (the fused pass adds this slice's own sums)
        carry, count = others[:, :D], final[:, D].detach()
    g = mix_with_carry(z, w.coeff, w.gate_bias, rot, call.causal, call.activation, call.gate,
                       call.reduction == "mean", carry, count)
    return F.linear(g, w.out_weight, w.out_bias), _after(call, final, sl)
