"""Context parallelism: a sequence split across ranks, mixed with O(D) communication per layer and rank.

Inside ``with polymixer.context_parallel(group):`` every rank holds a contiguous slice of each sequence (dim 1 of a
mixer's input, slices in rank order, lengths may differ). PoM needs almost nothing from the other ranks: full mixing
the total of every rank's (B, D + 1) sum and count (one all-reduce), causal mixing the sums of the ranks before (an
exclusive scan over the ranks), block-causal mixing also the next ranks' sums of the block that runs past this slice;
the value-carrying PoM the same with its states, its token shift a halo of the last W − 1 projections (what each
mode sends: docs/parallel.md).

Nothing of this depends on N, and nothing reads a tensor on the host: which rank sends what to whom follows from
the slice lengths alone, which the context learns once (given as ``lengths``, or exchanged at its first call).
Whether the ranks agree on a call (its mode, shapes, dtype, device) is checked by one collective at the context's
first call (``check="first"``), at every call (``"every"``) or never (``"none"``): a call the ranks disagree on
raises the same one-line error on every rank instead of hanging.

This module holds what every op needs: the active context, the differentiable collectives (an all-reduce, the rank
scans, the point-to-point exchange of the halos, the all-gather of rows that attention needs), the bytes each rank
sends (counted from the tensors it sends), the agreement, and the slice arithmetic of block-causal masking. The ops'
own context-parallel forms live beside them (:mod:`polymixer.ops.pom.context_parallel`,
:mod:`polymixer.ops.value_pom.context_parallel`).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import InitVar, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .features import chunked_cumsum

__all__ = ["ContextParallel", "context_parallel", "active", "gather", "agree", "Slice",
           "mode_facts", "tensor_facts", "gather_rows", "FACTS", "TOTAL", "CHECKS", "even_slice", "gather_tokens",
           "local", "halo_before", "all_reduce_sum", "exclusive_scan", "causal_sums", "block_carry",
           "block_edges"]

TOTAL = {"bytes_sent": 0, "calls": 0}  # over every context of this process (logs, tests)
FACTS = 24  # integers a call is described by in the agreement (padded)
CHECKS = ("first", "every", "none")  # when the ranks check that they agree on a call (see the module docstring)
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_DEVICES = ("cpu", "cuda", "xpu", "mps")


@dataclass
class ContextParallel:
    """An active context: the process group its ranks share, every rank's slice length once known, when calls are
    checked, and the bytes this rank has sent so far.

    ``bytes_sent`` counts what leaves this rank: each point-to-point tensor it sends, 2 (P − 1) / P × the tensor
    of an all-reduce (a ring's share), (P − 1) × the local tensor of an all-gather. ``calls`` counts the transfers.

    The context holds its group weakly: kept alive (by a graph, or by the caller), it never keeps the group past
    ``destroy_process_group`` to the interpreter's exit, where gloo's worker threads can abort the process.
    """

    pg: InitVar[Any]  # the process group (read back as ``group``)
    rank: int
    world: int
    ranks: List[int] = field(default_factory=list)  # the global rank of each rank of the group
    lengths: Optional[List[int]] = None  # every rank's slice length (None: learnt at the first call)
    check: str = "first"
    agreed: bool = False
    bytes_sent: int = 0
    calls: int = 0
    log: List[Tuple[str, int]] = field(default_factory=list)

    def __post_init__(self, pg: Any) -> None:
        self._group = weakref.ref(pg)

    @property
    def group(self) -> Any:
        """The process group, while torch.distributed holds it."""
        if (pg := self._group()) is None:
            raise RuntimeError(f"context_parallel (rank {self.rank} of {self.world}): its process group was "
                               f"destroyed; a call or a backward under the context needs the group alive")
        return pg

    def count(self, what: str, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.calls += 1
        self.log.append((what, nbytes))
        TOTAL["bytes_sent"] += nbytes
        TOTAL["calls"] += 1

    def comm_device(self) -> torch.device:
        """Where the group's small host-side tensors (lengths, agreement) live: the current GPU under NCCL."""
        import torch.distributed as dist

        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(self.group) == "nccl" \
            else torch.device("cpu")

    def slice_of(self, n: int) -> "Slice":
        """This rank's :class:`Slice`, holding ``n`` tokens: from the context's lengths (one small all-gather, the
        only host read of a context, when they were neither given nor learnt at an agreement yet)."""
        if self.lengths is None:
            self.lengths = self._exchange_lengths(n)
        if self.lengths[self.rank] != n:
            raise ValueError(f"context_parallel (rank {self.rank} of {self.world}): a call on {n} tokens in a context "
                             f"whose slices hold {self.lengths}: enter a new context for sequences split otherwise")
        return Slice(self.rank, list(self.lengths))

    def start_of(self, n: int, device: Optional[torch.device] = None) -> int:
        """Where this rank's slice of ``n`` tokens starts in the whole sequence: the offset of default positions
        (learned or rotary) in a model under the context."""
        return self.slice_of(n).start

    def _exchange_lengths(self, n: int) -> List[int]:
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.int64, device=self.comm_device())
        parts = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(parts, t, group=self.group)
        self.count("slice lengths", (self.world - 1) * 8)
        return [int(v) for v in torch.cat(parts).tolist()]

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


def _check_lengths(lengths: Optional[Sequence[int]], world: int) -> Optional[List[int]]:
    if lengths is None:
        return None
    out = list(lengths)
    if len(out) != world or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in out):
        raise ValueError(f"context_parallel lengths must be {world} positive ints (every rank's slice length, in "
                         f"rank order), got {lengths!r}")
    return out


@contextlib.contextmanager
def context_parallel(group: Any = None, lengths: Optional[Sequence[int]] = None,
                     check: str = "first") -> Iterator[ContextParallel]:
    """Within the block, PoM and value-PoM calls (and the attention of hybrids) treat dim 1 of their input as this
    rank's contiguous slice of each sequence, slices in rank order.

    Args:
        group: a process group, a 1-D DeviceMesh, or None (the whole world). Every rank of the group must make the
            same calls in the same order (as with any collective).
        lengths: every rank's slice length, in rank order, when the caller knows them (a layer then reads nothing
            on the host); None: learnt once, at the context's first call. Every call of the context mixes slices of
            these lengths.
        check: "first" (default) — the ranks check once, at the first call, that they agree on it (mode, shapes,
            dtype, device: a disagreement is the same error on every rank, never a hang); "every" — at every call;
            "none" — never (the caller checked; a call a rank refuses then fails on that rank only).

    Yields the :class:`ContextParallel`, whose ``bytes_sent`` counts this rank's communication.
    """
    import torch.distributed as dist

    if check not in CHECKS:
        raise ValueError(f"context_parallel check must be one of {CHECKS}, got {check!r}")
    pg = _resolve_group(group)
    rank = dist.get_rank(pg)
    if rank < 0:
        raise ValueError(f"rank {dist.get_rank()} is not a member of the context-parallel group it was given")
    world = dist.get_world_size(pg)
    ranks = [dist.get_global_rank(pg, r) for r in range(world)]
    cp = ContextParallel(pg, rank, world, ranks, _check_lengths(lengths, world), check)
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


# ---------------------------------------------------------------------------------------------- the transfers
def _p2p(cp: ContextParallel, sends: Sequence[Tuple[int, Tensor]], recvs: Sequence[Tuple[int, Tensor]],
         what: str, during: Optional[List[Callable[[], None]]] = None) -> None:
    """One round of point-to-point transfers (peers are ranks of the group): every send and receive posted at
    once, then awaited (no host read of the data; under NCCL the wait orders the streams only). ``during``: work
    to run while the transfers are in flight (taken from the list: it runs once, in the first round)."""
    import torch.distributed as dist

    ops = [dist.P2POp(dist.isend, t, cp.ranks[peer], cp.group) for peer, t in sends]
    ops += [dist.P2POp(dist.irecv, buf, cp.ranks[peer], cp.group) for peer, buf in recvs]
    works = dist.batch_isend_irecv(ops) if ops else []
    while during:
        during.pop()()
    for work in works:
        work.wait()
    for _, t in sends:
        cp.count(what, t.numel() * t.element_size())


def _linked(a: int, b: int, edges: Sequence[bool]) -> bool:
    """Whether ranks a and b (either order) are joined: both exist and every edge between them is open
    (``edges[i]`` joins ranks i and i + 1)."""
    lo, hi = min(a, b), max(a, b)
    return lo >= 0 and hi <= len(edges) and all(edges[lo:hi])


def _scan(x: Tensor, cp: ContextParallel, edges: Sequence[bool], reverse: bool, exclusive: bool,
          what: str, during: Optional[List[Callable[[], None]]] = None) -> Tensor:
    """Σ of ``x`` over the ranks before this one (after it, ``reverse``) joined to it by open edges — with this
    rank's own (inclusive) or without (exclusive) — by recursive doubling: ⌈log₂ P⌉ rounds, in each at most one
    send and one receive of x's size per rank. Which ranks talk follows from ``edges`` alone (known everywhere)."""
    step = -1 if reverse else 1
    run, got = x.contiguous(), torch.zeros_like(x)
    d = 1
    while d < cp.world:
        to, frm = cp.rank + step * d, cp.rank - step * d
        buf = torch.empty_like(run) if _linked(frm, cp.rank, edges) else None
        _p2p(cp, [(to, run)] if _linked(cp.rank, to, edges) else [], [] if buf is None else [(frm, buf)], what,
             during)
        if buf is not None:
            run, got = run + buf, got + buf
        d *= 2
    return got if exclusive else run


def _tree_scan(x: Tensor, cp: ContextParallel, reverse: bool, what: str,
               during: Optional[List[Callable[[], None]]] = None) -> Tensor:
    """Σ of ``x`` over the ranks before this one (after it, ``reverse``) by the work-efficient tree (Blelloch): an
    up-sweep of partial sums, then a down-sweep of prefixes — 2 log₂ P − 1 rounds, but 2 P − 2 − log₂ P sends in all
    instead of recursive doubling's ~P log₂ P: half the bytes on average at 8 ranks. P a power of two."""
    P = cp.world
    peer = (lambda v: P - 1 - v) if reverse else (lambda v: v)
    v = peer(cp.rank)
    val, kept = x.contiguous(), {}
    d = 1
    while d < P:  # up-sweep: a right node adds its left sibling's subtree sum
        if (v + 1) % (2 * d) == 0:
            kept[d] = torch.empty_like(val)
            _p2p(cp, [], [(peer(v - d), kept[d])], what, during)
            val = val + kept[d]
        elif (v + 1) % (2 * d) == d:
            _p2p(cp, [(peer(v + d), val)], [], what, during)
        d *= 2
    new: Optional[Tensor] = None  # this node's prefix; None while it is structurally zero (nothing sent)
    d = P // 2
    while d >= 1:  # down-sweep: a left node takes its parent's prefix, the right one adds the left subtree's sum
        if (v + 1) % (2 * d) == 0:
            if new is not None:
                _p2p(cp, [(peer(v - d), new)], [], what)
            new = kept[d] if new is None else new + kept[d]
        elif (v + 1) % (2 * d) == d and v != d - 1:
            new = torch.empty_like(val)
            _p2p(cp, [], [(peer(v + d), new)], what)
        d //= 2
    return torch.zeros_like(val) if new is None else new


def _prefix(x: Tensor, cp: ContextParallel, reverse: bool, what: str,
            during: Optional[List[Callable[[], None]]] = None) -> Tensor:
    """The exclusive scan over every rank: the tree where P is a power of two (fewer bytes), recursive doubling
    otherwise (fewer rounds, any P). ``during`` runs while the first transfer is in flight (or at the end, on a
    rank that has none)."""
    if cp.world & (cp.world - 1) == 0:
        out = _tree_scan(x, cp, reverse, what, during)
    else:
        out = _scan(x, cp, [True] * (cp.world - 1), reverse, True, what, during)
    while during:
        during.pop()()
    return out


def _hop(x: Tensor, cp: ContextParallel, edges: Sequence[bool], reverse: bool, what: str) -> Tensor:
    """The next rank's ``x`` (the previous rank's, not ``reverse``) where the edge between them is open, else
    zeros: one send and one receive at most."""
    nxt = cp.rank - 1 if reverse else cp.rank + 1
    prv = cp.rank + 1 if reverse else cp.rank - 1
    buf = torch.zeros_like(x)
    _p2p(cp, [(nxt, x.contiguous())] if _linked(cp.rank, nxt, edges) else [],
         [(prv, buf)] if _linked(prv, cp.rank, edges) else [], what)
    return buf


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, cp: ContextParallel, what: str) -> Tensor:  # type: ignore[override]
        ctx.cp, ctx.what = cp, what
        return _all_reduce(x, cp, what)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tuple[Optional[Tensor], None, None]:  # type: ignore[override]
        return _all_reduce(g, ctx.cp, ctx.what + " (backward)"), None, None


def _all_reduce(x: Tensor, cp: ContextParallel, what: str) -> Tensor:
    import torch.distributed as dist

    y = x.contiguous().clone()
    dist.all_reduce(y, group=cp.group)
    cp.count(what, 2 * (cp.world - 1) * y.numel() * y.element_size() // cp.world)
    return y


def all_reduce_sum(x: Tensor, cp: ContextParallel, what: str = "all-reduce") -> Tensor:
    """Σ over the ranks of ``x`` (same shape everywhere), differentiable (the backward all-reduces the gradient:
    every rank's loss reads the total). Each rank sends 2 (P − 1) / P × x — at most twice x, whatever P."""
    return _AllReduce.apply(x, cp, what)


class _ExclusiveScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, cp: ContextParallel, what: str) -> Tensor:  # type: ignore[override]
        ctx.cp, ctx.what = cp, what
        return _prefix(x, cp, False, what)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tuple[Optional[Tensor], None, None]:  # type: ignore[override]
        cp = ctx.cp  # the transpose of a prefix over the ranks before is the suffix over the ranks after
        return _prefix(g, cp, True, ctx.what + " (backward)"), None, None


def exclusive_scan(x: Tensor, cp: ContextParallel, what: str = "exclusive scan") -> Tensor:
    """Σ of ``x`` over the ranks before this one (zeros on the first), differentiable: O(log P) point-to-point
    rounds of x's size forward, as many backward (the scan reversed); 2 − (2 + log₂ P) / P sends of x per rank on
    average each way where P is a power of two (:func:`_tree_scan`), ⌈log₂ P⌉ at most otherwise."""
    return _ExclusiveScan.apply(x, cp, what)


class _CausalSums(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, pc: Tensor, cp: ContextParallel, what: str) -> Tuple[Tensor, Tensor]:  # type: ignore[override]
        ctx.cp, ctx.what = cp, what
        run: List[Tensor] = []
        prefix = _prefix(pc.sum(1), cp, False, what, [lambda: run.append(chunked_cumsum(pc, reverse=False))])
        return prefix, run[0]

    @staticmethod
    def backward(ctx: Any, g_prefix: Tensor, g_run: Tensor) -> Tuple[Optional[Tensor], None, None]:  # type: ignore
        back: List[Tensor] = []  # the running sums' transpose (a reverse cumulative sum) while the scan travels
        g_local = _prefix(g_prefix, ctx.cp, True, ctx.what + " (backward)",
                          [lambda: back.append(chunked_cumsum(g_run.contiguous(), reverse=True))])
        return back[0] + g_local.unsqueeze(1), None, None


def causal_sums(pc: Tensor, cp: ContextParallel, what: str = "causal sums") -> Tuple[Tensor, Tensor]:
    """(Σ over the ranks before this one of this slice's total of ``pc`` (B, n, C) → (B, C), the local running sums
    (B, n, C)), differentiable: the running sums are computed while the scan's first transfer is in flight, and
    their gradient while the backward's is."""
    return _CausalSums.apply(pc, cp, what)


def block_edges(sl: "Slice", block: int) -> Tuple[List[bool], List[bool]]:
    """The two edge lists of block-causal masking over the ranks, from the slice lengths alone:
    ``same[i]`` — ranks i and i + 1 start in the same block (a block's later ranks pass their sums down to its
    earlier ones); ``reads[i]`` — rank i + 1 starts in the block of rank i's last token (rank i's last queries read
    it)."""
    starts = sl.starts()
    first = [s // block for s in starts]
    last = [(s + n - 1) // block for s, n in zip(starts, sl.lengths)]
    same = [first[i + 1] == first[i] for i in range(len(starts) - 1)]
    reads = [first[i + 1] == last[i] for i in range(len(starts) - 1)]
    return same, reads


class _BlockCarry(torch.autograd.Function):
    """(the sums of the ranks before, the sums of the block that runs past this slice on the next ranks): one node,
    so that its backward's transfers run in one order on every rank."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, head: Tensor, cp: ContextParallel, same: List[bool], reads: List[bool],
                what: str) -> Tuple[Tensor, Tensor]:  # type: ignore[override]
        ctx.cp, ctx.same, ctx.reads, ctx.what = cp, same, reads, what
        prefix = _prefix(local, cp, False, what + " prefix")
        tail = _hop(_scan(head, cp, same, True, False, what + " block tail"), cp, reads, True, what + " block tail")
        return prefix, tail

    @staticmethod
    def backward(ctx: Any, g_prefix: Tensor, g_tail: Tensor) -> Tuple[Any, ...]:  # type: ignore[override]
        cp, what = ctx.cp, ctx.what + " (backward)"
        g_local = _prefix(g_prefix, cp, True, what)
        g_head = _scan(_hop(g_tail, cp, ctx.reads, False, what), cp, ctx.same, False, False, what)
        return g_local, g_head, None, None, None, None


def block_carry(local: Tensor, head: Tensor, sl: "Slice", block: int, cp: ContextParallel,
                what: str = "block-causal sums") -> Tuple[Tensor, Tensor]:
    """(Σ of ``local`` over the ranks before this one, Σ of ``head`` over the later ranks that start in the block
    of this slice's last token): ``local`` is this slice's sum, ``head`` its sum over its first block. O(log P)
    rounds of one send and one receive each, forward and backward."""
    same, reads = block_edges(sl, block)
    return _BlockCarry.apply(local, head, cp, same, reads, what)


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, cp: ContextParallel, dsts: List[int], srcs: List[int],
                what: str) -> Tensor:  # type: ignore[override]
        ctx.cp, ctx.dsts, ctx.srcs, ctx.what = cp, dsts, srcs, what
        bufs = [torch.empty_like(x) for _ in srcs]
        _p2p(cp, [(d, x.contiguous()) for d in dsts], list(zip(srcs, bufs)), what)
        return torch.stack(bufs) if bufs else x.new_zeros((0, *x.shape))

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tuple[Optional[Tensor], None, None, None, None]:  # type: ignore[override]
        cp = ctx.cp  # the gradients go back the way the rows came
        shape = g.shape[1:]
        bufs = [torch.empty(shape, dtype=g.dtype, device=g.device) for _ in ctx.dsts]
        _p2p(cp, [(s, g[i].contiguous()) for i, s in enumerate(ctx.srcs)], list(zip(ctx.dsts, bufs)),
             ctx.what + " (backward)")
        return sum(bufs, torch.zeros(shape, dtype=g.dtype, device=g.device)), None, None, None, None


def halo_before(tail: Tensor, lags: int, sl: "Slice", cp: ContextParallel, what: str,
                prev: Optional[Tensor] = None) -> Tensor:
    """The ``lags`` rows before this slice's first token (B, lags, C), oldest first — what a causal token shift /
    short convolution of width ``lags + 1`` reads across the slice boundary: the last rows of the ranks before this
    one (as many ranks as short slices need), after a stream's ``prev`` (B, ≤ lags, C), zeros before the sequence.

    ``tail``: this slice's last ``min(lags, n)`` rows (B, ≤ lags, C), already masked. Each rank sends its tail
    point to point to the ranks that read it (the next one, more only past slices shorter than ``lags``)."""
    take = tail.shape[1]
    z = torch.nn.functional.pad(tail, (0, 0, lags - take, 0))
    starts = sl.starts()
    reads = [d for d in range(sl.rank + 1, len(sl.lengths)) if starts[d] - (sl.start + sl.length) < lags]
    srcs = [s for s in range(sl.rank) if sl.start - (starts[s] + sl.lengths[s]) < lags]
    got = _Exchange.apply(z, cp, reads, srcs, what)  # (len(srcs), B, lags, C)
    pieces = [] if prev is None else [prev.to(z.dtype)]
    pieces += [got[i][:, lags - min(lags, sl.lengths[s]):] for i, s in enumerate(srcs)]
    # the zeros come from the exchange's output so that every rank's graph reaches its backward (transfers too)
    before = torch.cat([got.sum(0) * 0] + pieces, dim=1)
    return before[:, -lags:]


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

        cp = ctx.cp  # a reduce-scatter: each rank keeps the sum of the gradients of its own copy
        grad = grad.contiguous()
        out = torch.empty_like(grad[0])
        dist.reduce_scatter(out, list(grad.unbind(0)), group=cp.group)
        cp.count(ctx.what + " (backward)", (cp.world - 1) * out.numel() * out.element_size())
        return out, None, None


def gather(t: Tensor, cp: ContextParallel, what: str = "gather") -> Tensor:
    """(P, …): every rank's ``t`` (same shape on every rank), differentiable: the gradient of a rank's ``t`` is the
    sum over ranks of the gradients of its copies (a reduce-scatter). For what must grow with P — attention's keys
    and values; PoM's sums travel by :func:`all_reduce_sum` and the scans."""
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
    """Every rank's slice length, after the ranks checked that they agree on the call when the context asks
    (``check``: at its first call, at every call, or never — see :func:`context_parallel`).

    ``facts``: named integers that must match on every rank, the first of them the slice length (which may differ).
    A checked call is one all-gather of every rank's description and whether its own checks passed, and raises the
    same one-line ValueError on every rank if any rank failed or the ranks disagree, so that a bad call never leaves
    the others waiting in a collective. An unchecked call reads nothing from the other ranks."""
    if cp.check == "none" or (cp.check == "first" and cp.agreed):
        if problem is not None:
            raise ValueError(f"{name} under context_parallel (rank {cp.rank} of {cp.world}): {problem}")
        return cp.slice_of(int(facts["length"])).lengths
    rows = _describe(cp, name, facts, problem)
    cp.agreed = True
    if problem is not None:
        raise ValueError(f"{name} under context_parallel (rank {cp.rank} of {cp.world}): {problem}")
    _compare(name, list(facts), rows)
    lengths = [row[1] for row in rows]
    if cp.lengths is not None and lengths != cp.lengths:
        raise ValueError(f"{name} under context_parallel: the ranks hold slices of {lengths} tokens, the context was "
                         f"given {cp.lengths}")
    cp.lengths = lengths
    return lengths


def _describe(cp: ContextParallel, name: str, facts: Dict[str, int], problem: Optional[str]) -> List[List[int]]:
    """Every rank's row [failed, *facts] (one all-gather of a fixed size, so that a rank that failed early — with
    fewer facts — still matches the others' collective)."""
    import torch.distributed as dist

    values = [int(v) for v in facts.values()]
    if len(values) > FACTS:
        raise ValueError(f"{name}: {len(values)} facts to agree on, at most {FACTS}")
    row = torch.tensor([0 if problem is None else 1, *values, *([0] * (FACTS - len(values)))], dtype=torch.int64,
                       device=cp.comm_device())
    parts = [torch.empty_like(row) for _ in range(cp.world)]
    dist.all_gather(parts, row, group=cp.group)
    cp.count(name + " (agreement)", (cp.world - 1) * row.numel() * 8)
    return [p.tolist() for p in parts]


def _fact_text(name: str, value: int) -> str:
    if name == "dtype":
        return str(_DTYPES[value - 1]).replace("torch.", "") if 0 < value <= len(_DTYPES) else "another dtype"
    if name == "device type":
        return _DEVICES[value - 1] if 0 < value <= len(_DEVICES) else "another device"
    return str(value)


def _compare(name: str, names: List[str], rows: List[List[int]]) -> None:
    """The same ValueError on every rank when a rank failed its own checks, holds no token, or describes its call
    otherwise than rank 0."""
    bad = [r for r, row in enumerate(rows) if row[0]]
    if bad:
        raise ValueError(f"{name} under context_parallel: rank(s) {bad} rejected their slice (their own error says "
                         f"why); every rank stops")
    empty = [r for r, row in enumerate(rows) if row[1] < 1]
    if empty:
        raise ValueError(f"{name} under context_parallel: rank(s) {empty} hold an empty slice; every rank needs at "
                         f"least one token of each sequence")
    for r, row in enumerate(rows):
        differ = [f"{k} {_fact_text(k, row[1 + i])} (rank 0: {_fact_text(k, rows[0][1 + i])})"
                  for i, k in enumerate(names) if i > 0 and row[1 + i] != rows[0][1 + i]]
        if differ:
            raise ValueError(f"{name} under context_parallel: rank {r} calls with " + ", ".join(differ) +
                             "; only the slice length may differ between ranks")


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
        return [sum(self.lengths[:r]) for r in range(len(self.lengths))]


def mode_facts(causal: bool, block_size: Optional[int], key_mask: Optional[Tensor], rope: Optional[str],
               positions: Optional[Tensor], stream: bool) -> Dict[str, int]:
    """The named integers that describe a call's mode for :func:`agree`."""
    return {"causal": int(causal), "block_size": int(block_size or 0), "key padding": int(key_mask is not None),
            "rotary": {None: 0, "1d": 1, "2d": 2}[rope], "explicit positions": int(positions is not None),
            "streaming": int(stream)}


def tensor_facts(x: Tensor) -> Dict[str, int]:
    """The dtype and device type of a call's input as agreement facts (ranks that differ would otherwise exchange
    tensors of different sizes: an abort under gloo, a hang or garbage under NCCL)."""
    dtype = _DTYPES.index(x.dtype) + 1 if x.dtype in _DTYPES else 99
    device = _DEVICES.index(x.device.type) + 1 if x.device.type in _DEVICES else 99
    return {"dtype": dtype, "device type": device}
