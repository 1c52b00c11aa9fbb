"""The value-carrying PoM under context parallelism (:mod:`polymixer.ops.parallel`).

The same decomposition as PoM's (:mod:`polymixer.ops.pom.context_parallel`) with the (B, heads, D/h, dv/h)
states in place of the (B, D) sums: full mixing sums every rank's state; causal mixing starts this slice's chunked
mixing from the states of the ranks before it; block-causal mixing aligns the slice to the global blocks
(zero-weight tokens in front), starts from the same prefix and adds, for the queries of the block that runs past the
slice, the next ranks' states of that block. The token shift / short convolution of width W reads the W − 1
projections before the slice's first token: each rank sends its last W − 1 (masked) key / value projections — a
halo, gathered once.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import check_mix_inputs, check_positions
from ..parallel import ContextParallel, Slice, agree, block_tail_ranks, gather, halo_before, mode_facts
from .modular import (check_layout, check_rope, heads_view, rotate_heads, value_features, value_mix, value_output,
                      value_pom, value_pom_step)

__all__ = ["forward", "step"]


def _bind(fn: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _validate(a: Dict[str, Any], stream: bool) -> Tuple[int, int, Optional[Tensor]]:
    """(D, dv, key mask) of a call that can be split, else a ValueError saying why."""
    x = a["x"]
    if not stream:
        if a["context"] is not None:
            raise ValueError("cross-mixing cannot be split: pass the whole context on every rank")
        if a["cu_seqlens"] is not None:
            raise ValueError("packed sequences (cu_seqlens) cannot be split across ranks: give each rank a padded "
                             "batch slice")
    D, dv = check_layout(a["in_weight"], a["coeff"], a["coeff_q"], a["out_weight"], a["heads"])
    check_rope(a["rope"], D, a["heads"])
    if a["reduction"] not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {a['reduction']!r}")
    mask = a["mask"]
    causal = a["causal"] if not stream else True
    block = a.get("block_size") if not stream else None
    _, _, _, key_mask, general, _, _ = check_mix_inputs(x, None, a["out_weight"].shape[0], mask, causal, block, None)
    if general is not None:
        raise ValueError("an explicit (B, M, N) mask cannot be split: use key padding, causal or block-causal masking")
    if a["rope"] == "2d" and a["positions"] is None:
        raise ValueError("2-D rotary needs this slice's explicit (row, col) positions")
    return D, dv, key_mask


def _halo(x: Tensor, in_weight: Tensor, rows: int, key_mask: Optional[Tensor], lags: int, sl: Slice,
          cp: ContextParallel, prev: Optional[Tensor]) -> Tensor:
    """The ``lags`` key / value projections before this slice's first token (B, lags, D + dv), oldest first."""
    n = x.shape[1]
    take = min(lags, n)
    z = F.linear(x[:, n - take:], in_weight[:rows])
    if key_mask is not None:
        z = z * key_mask[:, n - take:, None].to(z.dtype)
    return halo_before(z, lags, sl, cp, "value-pom token-shift halo", prev)


def _mix(a: Dict[str, Any], cp: ContextParallel, problem: Optional[str], stream: Optional[Tuple[Tensor, ...]]
         ) -> Tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """(y, state after this slice, count after it, the last W − 1 projections, the global length)."""
    D = dv = 0
    key_mask = None
    if problem is None:
        try:
            D, dv, key_mask = _validate(a, stream is not None)
        except (ValueError, TypeError) as e:
            problem = str(e)
    x = a["x"]
    n = x.shape[1] if isinstance(x, Tensor) and x.dim() == 3 else 0
    causal = True if stream is not None else bool(a.get("causal"))
    block = None if stream is not None else a.get("block_size")
    shift = a["shift_weight"]
    facts = {"length": n}
    if not problem:
        facts.update({"batch": x.shape[0], "width": x.shape[-1], "D": D, "dv": dv, "heads": a["heads"],
                      "chunk": a["chunk"], "shift width": 0 if shift is None else shift.shape[0]})
        facts.update(mode_facts(causal, block, key_mask, a["rope"], a["positions"], stream is not None))
    sl = Slice(cp.rank, agree(cp, "value pom", facts, problem))
    B, H = x.shape[0], a["heads"]
    in_weight = a["in_weight"]
    state_in = count_in = offset = prev_in = None
    if stream is not None:
        state_in, count_in, offset, prev_in = stream

    prev = None
    if shift is not None:
        prev = _halo(x, in_weight, D + dv, key_mask, shift.shape[0] - 1, sl, cp, prev_in)
    phi, v, psi, zs, last = value_features(x, x, in_weight, a["coeff"], a["coeff_q"], dv, shift, key_mask, prev,
                                           True, a["activation"])
    if state_in is not None:
        acc = state_in.dtype
        phi, v, psi = phi.to(acc), v.to(acc), psi.to(acc)
    w = key_mask.to(phi.dtype) if key_mask is not None else phi.new_ones(B, n)
    k, q, vh = heads_view(phi * w.unsqueeze(-1), H), heads_view(psi, H), heads_view(v, H)
    if a["rope"] is not None:
        two_d = a["rope"] == "2d"
        pos = a["positions"]
        if pos is None:
            pos = sl.start + torch.arange(n, device=x.device)
            if offset is not None:
                pos = offset.unsqueeze(1) + pos
        check_positions(pos, B, n, two_d, "positions")
        k, q = rotate_heads(k, pos, a["rope_base"], two_d), rotate_heads(q, pos, a["rope_base"], two_d)

    total = torch.einsum("bhnd,bhne->bhde", k, vh)  # this slice's state (B, H, D_h, dv_h)
    X = total[0].numel()
    flat = torch.cat([total.reshape(B, X), w.sum(1, keepdim=True)], dim=1)  # (B, X + 1): state and count
    if not causal:
        allsum = gather(flat, cp, "value-pom full states").sum(0)
        S, cnt_all = allsum[:, :X].view_as(total), allsum[:, X]
        o = torch.einsum("bhmd,bhde->bhme", q, S)
        o_cnt = cnt_all.unsqueeze(1).expand(B, n)
        final_state, final_count = S, cnt_all
    else:
        if block is None:
            prefix = gather(flat, cp, "value-pom causal states")[:cp.rank].sum(0)
            tail_parts = None
        else:
            lead = sl.start % block
            head_len = min(n, block - lead)
            head = torch.cat([torch.einsum("bhnd,bhne->bhde", k[:, :, :head_len], vh[:, :, :head_len]).reshape(B, X),
                              w[:, :head_len].sum(1, keepdim=True)], dim=1)
            both = gather(torch.cat([flat, head], dim=1), cp, "value-pom block-causal states")
            prefix = both[:cp.rank, :, :X + 1].sum(0)
            tail_parts = both[:, :, X + 1:]
        if state_in is not None:
            prefix = prefix + torch.cat([state_in.reshape(B, X).to(prefix.dtype),
                                         count_in.to(prefix.dtype).unsqueeze(1)], dim=1)
        S0, c0 = prefix[:, :X].view_as(total), prefix[:, X]
        if block is None:
            o, o_cnt, final_state, final_count = value_mix(q, k, vh, w, causal=True, chunk=a["chunk"], state=S0,
                                                           count=c0)
        else:  # aligned to the global blocks by `lead` zero-weight tokens in front
            kp, qp, vp = (F.pad(t, (0, 0, lead, 0)) for t in (k, q, vh))
            o, o_cnt, final_state, final_count = value_mix(qp, kp, vp, F.pad(w, (lead, 0)), causal=True,
                                                           block_size=block, chunk=a["chunk"], state=S0, count=c0)
            o, o_cnt = o[:, :, lead:], o_cnt[:, lead:]
            tail_ranks = block_tail_ranks(sl, block)
            if tail_ranks:
                tail = tail_parts[tail_ranks].sum(0)
                gi = sl.start + torch.arange(n, device=x.device)
                past = ((torch.div(gi, block, rounding_mode="floor") + 1) * block > sl.start + n).to(o.dtype)
                o = o + past.view(1, 1, n, 1) * torch.einsum("bhmd,bhde->bhme", q, tail[:, :X].view_as(total))
                o_cnt = o_cnt + past.unsqueeze(0) * tail[:, X:]
    y = value_output(o, o_cnt, zs, a["gate_bias"], a["norm_weight"], a["out_weight"], a["out_bias"],
                     a["reduction"], a["gate"])
    return y, final_state, final_count, last, sl.total


def forward(args: Tuple[Any, ...], kwargs: Dict[str, Any], cp: ContextParallel) -> Tensor:
    """:func:`polymixer.ops.value_pom.modular.value_pom` on this rank's slice of every sequence."""
    problem, a = None, None
    try:
        a = _bind(value_pom, args, kwargs)
    except TypeError as e:
        problem = str(e)
    if a is None:
        agree(cp, "value pom", {"length": 0}, problem)
    return _mix(a, cp, problem, None)[0]


def step(args: Tuple[Any, ...], kwargs: Dict[str, Any], cp: ContextParallel
         ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """A context-parallel prefill of a causal stream: (y, state, count, offset, prev) after this rank's slice — the
    whole prefix's on the last rank, where decoding continues."""
    problem, a = None, None
    try:
        a = _bind(value_pom_step, args, kwargs)
        if not a["causal"]:
            problem = "value_pom_step under context_parallel streams causally only (frames are not split)"
        a.update(context=None, cu_seqlens=None, block_size=None)
    except TypeError as e:
        problem = str(e)
    if a is None:
        agree(cp, "value pom", {"length": 0}, problem)
    stream = (a["state"], a["count"], a["offset"], a["prev"])
    y, state, count, last, n_total = _mix(a, cp, problem, stream)
    return (y, state.to(a["state"].dtype), count.to(a["count"].dtype), a["offset"] + n_total,
            last.to(a["prev"].dtype))
