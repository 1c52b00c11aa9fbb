"""Context parallelism: a sequence split across ranks, mixed with O(D) communication per layer.

Inside ``with polymixer.context_parallel(group):`` every rank holds a contiguous slice of each sequence (dim 1 of a
mixer's input, slices in rank order, lengths may differ). PoM needs almost nothing from the other ranks: full mixing
one all-gather of each rank's (B, D) sum and count; causal mixing the sums of the ranks before it (an exclusive
prefix); block-causal mixing the same plus, for the block that runs past this rank's slice, the sums of that block's
tokens on the next ranks; the value-carrying PoM the same with its (B, heads, D/h, dv/h) states, and the token shift
a halo of its W − 1 last projections. Every exchange is one all-gather whose size does not depend on N.

This module holds what every op needs: the active context, the differentiable all-gather (its backward sums the
gradients of every rank's copy: the loss of a context-parallel step is the sum of the ranks' losses), the bytes
each rank sends (counted from the collectives' tensors), the one-collective agreement check that turns a call the
ranks disagree on into the same error on every rank instead of a hang, and the slice arithmetic of block-causal
masking. The ops' own context-parallel forms live beside them (:mod:`polymixer.ops.pom.context_parallel`,
:mod:`polymixer.ops.value_pom.context_parallel`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["ContextParallel", "context_parallel", "active", "gather", "agree", "Slice", "block_tail_ranks",
           "mode_facts", "gather_rows", "FACTS", "TOTAL", "even_slice",
           "gather_tokens", "local", "halo_before"]

TOTAL = {"bytes_sent": 0, "calls": 0}  # over every context of this process (logs, tests)
FACTS = 24  # integers a call is described by in the agreement (padded)


@dataclass
class ContextParallel:
    """An active context: the process group its ranks share and the bytes this rank has sent so far.

    ``bytes_sent`` counts, per collective, what a ring implementation sends from each rank: (P − 1) × the local
    tensor for an all-gather (the forward's exchanges and their backward's all-reduce, 2 (P − 1) / P × the gathered
    tensor). ``calls`` counts the collectives.
    """

    group: Any
    rank: int
    world: int
    bytes_sent: int = 0
    calls: int = 0
    log: List[Tuple[str, int]] = field(default_factory=list)

    def count(self, what: str, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.calls += 1
        self.log.append((what, nbytes))
        TOTAL["bytes_sent"] += nbytes
        TOTAL["calls"] += 1

    def start_of(self, n: int, device: Optional[torch.device] = None) -> int:
        """Where this rank's slice of ``n`` tokens starts in the whole sequence (one small all-gather): the offset
        of default positions (learned or rotary) in a model under the context."""
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.int64)
        if dist.get_backend(self.group) == "nccl":
            t = t.cuda()
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t, group=self.group)
        self.count("slice lengths", (self.world - 1) * 8)
        return int(sum(int(p) for p in parts[:self.rank]))

    def reset(self) -> None:
        self.bytes_sent, self.calls = 0, 0
        self.log.clear()


_STACK: List[Optional[ContextParallel]] = []


def _resolve_group(group: Any) -> Any:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("context_parallel needs torch.distributed initialised (launch with torchrun, or call "
                           "torch.distributed.init_process_group first)")
    if group is None:
        return dist.group.WORLD
    if hasattr(group, "get_group") and hasattr(group, "ndim"):  # a DeviceMesh
        if group.ndim != 1:
            raise ValueError(f"context_parallel takes a 1-D DeviceMesh (or one of its dimensions), got a "
                             f"{group.ndim}-D mesh")
        return group.get_group()
    return group


@contextlib.contextmanager
def context_parallel(group: Any = None) -> Iterator[ContextParallel]:
    """Within the block, PoM and value-PoM calls (and the attention of hybrids) treat dim 1 of their input as this
    rank's contiguous slice of each sequence, slices in rank order.

    Args:
        group: a process group, a 1-D DeviceMesh, or None (the whole world). Every rank of the group must make the
            same calls in the same order (as with any collective).

    Yields the :class:`ContextParallel`, whose ``bytes_sent`` counts this rank's communication.
    """
    import torch.distributed as dist

    pg = _resolve_group(group)
    rank = dist.get_rank(pg)
    if rank < 0:
        raise ValueError(f"rank {dist.get_rank()} is not a member of the context-parallel group it was given")
    cp = ContextParallel(pg, rank, dist.get_world_size(pg))
    _STACK.append(cp)
    try:
        yield cp
    finally:
        del _STACK[next(i for i in range(len(_STACK) - 1, -1, -1) if _STACK[i] is cp)]


def active() -> Optional[ContextParallel]:
    """The innermost active context, or None (also None while a world of one rank is active: nothing to split, and
    inside :func:`local`)."""
    if not _STACK:
        return None
    cp = _STACK[-1]
    return cp if cp is not None and cp.world > 1 else None


@contextlib.contextmanager
def local() -> Iterator[None]:
    """Inside a context, a stretch of the model that every rank runs on the same whole tensors (after the
    sequence was gathered): its mixers mix what they are given, as outside the context."""
    _STACK.append(None)  # type: ignore[arg-type]
    try:
        yield
    finally:
        _STACK.pop()


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: Tensor, cp: ContextParallel, what: str) -> Tensor:  # type: ignore[override]
        import torch.distributed as dist

        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(cp.world)]
        dist.all_gather(parts, t, group=cp.group)
        cp.count(what, (cp.world - 1) * t.numel() * t.element_size())
        ctx.cp, ctx.what = cp, what
        return torch.stack(parts)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tuple[Optional[Tensor], None, None]:  # type: ignore[override]
        import torch.distributed as dist

        cp = ctx.cp
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=cp.group)
        cp.count(ctx.what + " (backward)", 2 * (cp.world - 1) * grad.numel() * grad.element_size() // cp.world)
        return grad[cp.rank], None, None


def gather(t: Tensor, cp: ContextParallel, what: str = "gather") -> Tensor:
    """(P, …): every rank's ``t`` (same shape on every rank), differentiable: the gradient of a rank's ``t`` is the
    sum over ranks of the gradients of its copies."""
    return _Gather.apply(t, cp, what)


def gather_rows(t: Tensor, cp: ContextParallel, lengths: Sequence[int], what: str) -> Tuple[List[Tensor], Tensor]:
    """Every rank's rows of (B, n_r, …) ``t`` (lengths may differ: padded to the longest for the all-gather,
    differentiable), and a zero tensor shaped like ``t``'s rows that is part of the gather's graph — start every
    concatenation from it, so that every rank reaches the gather's backward (a collective) even where it reads no
    other rank's rows."""
    L = max(lengths)
    pad = [0, 0] * (t.dim() - 2) + [0, L - t.shape[1]]
    parts = gather(torch.nn.functional.pad(t, pad), cp, what)  # (P, B, L, …)
    return [parts[r][:, :n] for r, n in enumerate(lengths)], parts[0][:, :0] * 0


def halo_before(tail: Tensor, lags: int, sl: "Slice", cp: ContextParallel, what: str,
                prev: Optional[Tensor] = None) -> Tensor:
    """The ``lags`` rows before this slice's first token (B, lags, C), oldest first — what a causal token shift /
    short convolution of width ``lags + 1`` reads across the slice boundary: the last rows of the ranks before this
    one (as many ranks as short slices need), after a stream's ``prev`` (B, ≤ lags, C), zeros before the sequence.

    ``tail``: this slice's last ``min(lags, n)`` rows (B, ≤ lags, C), already masked; one all-gather of (B, lags, C)
    per call, whatever N."""
    take = tail.shape[1]
    z = torch.nn.functional.pad(tail, (0, 0, lags - take, 0))
    tails = gather(z, cp, what)  # (P, B, lags, C)
    pieces = [] if prev is None else [prev.to(tails.dtype)]
    pieces += [tails[r][:, lags - min(lags, sl.lengths[r]):] for r in range(sl.rank)]
    # the zeros are taken from the gathered tensor so that every rank's graph reaches the all-gather: its backward
    # is a collective, and a rank that skipped it (the first, which reads no halo) would leave the others waiting
    before = torch.cat([tails[0] * 0] + pieces, dim=1)
    return before[:, -lags:]


def even_slice(n: int, cp: ContextParallel, what: str) -> Tuple[int, int]:
    """[a, b): this rank's equal share of ``n`` items (a model that splits its own tokens under the context)."""
    if n % cp.world:
        raise ValueError(f"context_parallel over {cp.world} ranks needs {what} divisible by {cp.world}, got {n}")
    k = n // cp.world
    return cp.rank * k, (cp.rank + 1) * k


def gather_tokens(t: Tensor, cp: ContextParallel, what: str = "tokens") -> Tensor:
    """The whole sequence from every rank's equal slice (B, n, …) → (B, P·n, …), differentiable (each rank's
    gradient flows back to the rank that computed it)."""
    parts = gather(t, cp, what)  # (P, B, n, …)
    return torch.cat(list(parts.unbind(0)), dim=1)


def agree(cp: ContextParallel, name: str, facts: Dict[str, int], problem: Optional[str]) -> List[int]:
    """One all-gather of every rank's call description and whether its local checks passed.

    ``facts``: named integers that must match on every rank, the first of them the slice length (which may differ).
    Raises the same one-line ValueError on every rank if any rank failed or the ranks disagree, so that a bad call
    never leaves the others waiting in a collective. Returns every rank's slice length."""
    import torch.distributed as dist

    names, values = list(facts), [int(v) for v in facts.values()]
    if len(values) > FACTS:
        raise ValueError(f"{name}: {len(values)} facts to agree on, at most {FACTS}")
    # a fixed size, so that a rank that failed early (fewer facts) still matches the others' collective
    local = torch.tensor([0 if problem is None else 1, *values, *([0] * (FACTS - len(values)))], dtype=torch.int64)
    if dist.get_backend(cp.group) == "nccl":
        local = local.cuda()
    parts = [torch.empty_like(local) for _ in range(cp.world)]
    dist.all_gather(parts, local, group=cp.group)
    cp.count(name + " (agreement)", (cp.world - 1) * local.numel() * 8)
    rows = [p.tolist() for p in parts]
    if problem is not None:
        raise ValueError(f"{name} under context_parallel (rank {cp.rank} of {cp.world}): {problem}")
    bad = [r for r, row in enumerate(rows) if row[0]]
    if bad:
        raise ValueError(f"{name} under context_parallel: rank(s) {bad} rejected their slice (their own error says "
                         f"why); every rank stops")
    empty = [r for r, row in enumerate(rows) if row[1] < 1]
    if empty:
        raise ValueError(f"{name} under context_parallel: rank(s) {empty} hold an empty slice; every rank needs at "
                         f"least one token of each sequence")
    for r, row in enumerate(rows):
        differ = [f"{k} {row[1 + i]} (rank 0: {rows[0][1 + i]})" for i, k in enumerate(names)
                  if i > 0 and row[1 + i] != rows[0][1 + i]]
        if differ:
            raise ValueError(f"{name} under context_parallel: rank {r} calls with " + ", ".join(differ) +
                             "; only the slice length may differ between ranks")
    return [row[1] for row in rows]


@dataclass
class Slice:
    """This rank's slice of the global sequence: [start, start + length) of ``total`` tokens."""

    rank: int
    lengths: List[int]

    @property
    def start(self) -> int:
        return sum(self.lengths[:self.rank])

    @property
    def length(self) -> int:
        return self.lengths[self.rank]

    @property
    def total(self) -> int:
        return sum(self.lengths)

    def starts(self) -> List[int]:
        out, s = [], 0
        for n in self.lengths:
            out.append(s)
            s += n
        return out


def block_tail_ranks(sl: Slice, block: int) -> List[int]:
    """The later ranks whose first tokens belong to the block of this rank's last token: the queries of that block
    also see those tokens (block-causal masking). Each such rank contributes the sum over its tokens in its first
    block (all of them when its slice lies inside the block)."""
    if sl.length == 0:
        return []
    last_block = (sl.start + sl.length - 1) // block
    starts = sl.starts()
    out = []
    for r in range(sl.rank + 1, len(sl.lengths)):
        if starts[r] // block != last_block:
            break
        if sl.lengths[r]:
            out.append(r)
    return out


def mode_facts(causal: bool, block_size: Optional[int], key_mask: Optional[Tensor], rope: Optional[str],
               positions: Optional[Tensor], stream: bool) -> Dict[str, int]:
    """The named integers that describe a call's mode for :func:`agree`."""
    return {"causal": int(causal), "block_size": int(block_size or 0), "key padding": int(key_mask is not None),
            "rotary": {None: 0, "1d": 1, "2d": 2}[rope], "explicit positions": int(positions is not None),
            "streaming": int(stream)}
