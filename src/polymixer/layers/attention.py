"""The attention baseline on ``F.scaled_dot_product_attention``, with PoM's forward / step contract.

Same keyword arguments as :class:`polymixer.PoM` (masks, causal, block-causal, ``cu_seqlens``, rotary positions,
cross-attention) plus a sliding ``window`` (local attention). A causal sliding window is computed block-wise in
O(N·window) time and memory; ``step`` keeps a KV cache that grows for global attention and is a ring buffer of the
last ``window`` keys / values for local attention, so local layers decode in constant time and memory per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .pom import check_batch_size, check_rotary, shift_width
from ..ops.common import (
    CuSeqlens, batch_packed, check_bool_mask, check_mix_inputs, check_positions, check_tokens, ROPE_BASE, layer_modes,
)
from ..ops import parallel
from ..ops.call import BatchState
from ..ops.features import heads_view, last_visible, pattern_mask, positions_or_default, rotate_heads
from ..values import token_shift as shift_tokens

__all__ = ["Attention", "LocalAttention", "AttentionState", "sdpa"]


@dataclass
class AttentionState(BatchState):
    """KV cache of one attention layer.

    Attributes:
        k, v: (B, heads, capacity, head_dim) cached keys / values (rotary already applied to keys).
        index: (B, capacity) int64 stream index of the token in each slot (-1: empty).
        valid: (B, capacity) bool, the slot holds a token that takes part (not padding).
        filled: number of slots in use (global cache) — slots [0, filled) are live.
        offset: (B,) int64 stream index of the next token.
        window: ring-buffer size for local attention, None for a growing global cache.
        ptr: next ring slot to overwrite (local attention only).
        shift_prev: (B, W − 1, 2·dim) the last tokens' key / value projections, before the shift (the memory of a
            token shift of width W), None for a layer without one.

    ``step`` updates the buffers in place and returns the state (like every KV cache: no copy per token); indexing
    it copies the selected rows.
    """

    k: Tensor
    v: Tensor
    index: Tensor
    valid: Tensor
    offset: Tensor
    filled: int = 0
    window: Optional[int] = None
    ptr: int = 0
    shift_prev: Optional[Tensor] = None


def sdpa(q: Tensor, k: Tensor, v: Tensor, vis: Optional[Tensor], dropout_p: float = 0.0,
         is_causal: bool = False) -> Tensor:
    """``scaled_dot_product_attention`` with a boolean visibility mask broadcast over heads; a query that sees no
    key gets 0 (never NaN, whatever the backend)."""
    if vis is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal)
    has = vis.any(-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=vis | ~has, dropout_p=dropout_p)
    return out * has.to(out.dtype)


def _local_attention(
    q: Tensor, k: Tensor, v: Tensor, window: int, causal: bool, key_mask: Optional[Tensor], dropout_p: float
) -> Tensor:
    """Sliding-window attention in blocks of ``window`` queries: O(N·window), never N×N.

    Causal: query i sees keys (i − window, i]; bidirectional: |i − j| < window.
    """
    B, H, N, dh = q.shape
    W = window
    nb = -(-N // W)
    pad = nb * W - N
    left, right = W, (0 if causal else W)
    span = left + W + right
    # (B, H, nb, span, dh) each: every block's keys / values with the window around it
    kp, vp = (F.pad(t, (0, 0, left, pad + right)).unfold(2, span, W).transpose(-1, -2) for t in (k, v))
    qb = F.pad(q, (0, 0, 0, pad)).view(B, H, nb, W, dh)
    r = torch.arange(W, device=q.device)
    c = torch.arange(span, device=q.device)
    rel = (c[None, :] - left) - r[:, None]  # key index − query index
    allowed = ((rel <= 0) & (rel > -W)) if causal else (rel.abs() < W)
    kj = torch.arange(nb, device=q.device)[:, None] * W - left + c[None, :]  # (nb, span) global key index
    vis = allowed[None] & ((kj >= 0) & (kj < N))[:, None, :]  # (nb, W, span)
    if key_mask is not None:
        km = F.pad(key_mask, (left, pad + right), value=False).unfold(1, span, W)  # (B, nb, span)
        vis = vis[None] & km[:, :, None, :]
        vis = vis[:, None]  # (B, 1, nb, W, span)
    out = sdpa(qb, kp, vp, vis, dropout_p)
    return out.reshape(B, H, nb * W, dh)[:, :, :N]


class Attention(nn.Module):
    """Multi-head attention with the same forward / step contract as :class:`polymixer.PoM`; the sliding-window form
    is its subclass :class:`LocalAttention`.

    Args:
        dim: model width; heads: number of heads (dim must divide evenly).
        causal: default masking when ``forward(causal=None)``.
        bias: biases of the projections; qkv_bias: the q/k/v projection's alone (default: ``bias``; TSViT has
            none there but one on the output projection); dropout: attention-probability dropout.
        rope: None, "1d" or "2d" rotary positions on queries / keys (positions as for PoM).
        token_shift: a causal depthwise convolution of the key and value projections along the tokens — True (width
            2: each token and the previous one) or a width W ≥ 2 — the value-carrying PoM's token shift and the
            short convolution linear-attention libraries give every mixer (learned per channel, initialised 0.5 /
            0.5 on the current and previous token, 0 beyond); off by default. Queries are not shifted; packed
            sequences and padding never leak across it; ``step`` keeps the last W − 1 projections.
    """

    def __init__(
        self,
        dim: int,
        heads: int = 8,
        causal: bool = False,
        *,
        bias: bool = True,
        dropout: float = 0.0,
        rope: Optional[str] = None,
        rope_base: float = ROPE_BASE,
        qkv_bias: Optional[bool] = None,
        token_shift: Union[bool, int, None] = None,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
            raise ValueError(f"heads must be a positive int, got {heads!r}")
        if dim % heads:
            raise ValueError(f"dim = {dim} is not divisible by heads = {heads}")
        self.head_dim = dim // heads
        check_rotary(rope, self.head_dim, "head_dim")
        self.dim, self.heads, self.causal = dim, heads, causal
        self.window: Optional[int] = None  # LocalAttention's sliding window
        self.dropout = dropout
        self.rope, self.rope_base = rope, float(rope_base)
        fk = {"device": device, "dtype": dtype}
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias if qkv_bias is None else qkv_bias, **fk)
        self.proj = nn.Linear(dim, dim, bias=bias, **fk)
        # tokens the key / value shift reads (the current one included); 0: no shift
        self.shift_width = shift_width(token_shift)
        if self.shift_width:
            self.shift = nn.Parameter(torch.empty(self.shift_width, 2 * dim, **fk))
            self.shift.no_weight_decay = True
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """The token shift's initial weights: 0.5 on the current and previous token, 0 on older ones."""
        if self.shift_width:
            with torch.no_grad():
                self.shift.zero_()
                self.shift[:2] = 0.5

    def extra_repr(self) -> str:
        s = f"dim={self.dim}, heads={self.heads}, causal={self.causal}"
        s += (f", window={self.window}" if self.window else "") + (f", rope={self.rope!r}" if self.rope else "")
        return s + (f", token_shift={self.shift_width}" if self.shift_width else "")

    # -- projections ----------------------------------------------------------------------------------------------

    def _project_flat(self, x: Tensor, context: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """(B, M, dim) queries and (B, N, 2·dim) keys ‖ values, before the token shift."""
        if context is None:
            qkv = F.linear(x, self.qkv.weight, self.qkv.bias)
            return qkv[..., :self.dim], qkv[..., self.dim:]
        w, b = self.qkv.weight, self.qkv.bias
        q = F.linear(x, w[: self.dim], None if b is None else b[: self.dim])
        return q, F.linear(context, w[self.dim:], None if b is None else b[self.dim:])

    def _project(self, x: Tensor, context: Optional[Tensor], key_mask: Optional[Tensor] = None,
                 prev: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        """Queries, keys and values split into heads, keys and values through the token shift where the layer has
        one (over the context's tokens for cross-attention; ``prev``: the W − 1 projections before the first), and
        the last W − 1 projections (the shift's stream memory; None without a shift)."""
        q, kv = self._project_flat(x, context)
        last = None
        if self.shift_width:
            kv, last = shift_tokens(kv, self.shift, key_mask, prev)
        k, v = kv.split(self.dim, dim=-1)
        return heads_view(q, self.heads), heads_view(k, self.heads), heads_view(v, self.heads), last

    def _rotate(self, t: Tensor, positions: Tensor) -> Tensor:
        return rotate_heads(t, positions, self.rope_base, self.rope == "2d")

    def _merge(self, o: Tensor) -> Tensor:
        B, H, N, dh = o.shape
        return self.proj(o.transpose(1, 2).reshape(B, N, H * dh))

    # -- forward --------------------------------------------------------------------------------------------------

    def forward(self, x: Tensor, context: Optional[Tensor] = None, **modes: Any) -> Tensor:
        """Same arguments as :meth:`polymixer.PoM.forward`; ``causal`` not given uses the module's default."""
        mask, causal, block_size, cu_seqlens, positions, context_positions = layer_modes(self, modes)
        causal = self.causal if causal is None else causal
        x, context, squeeze = batch_packed(x, context, cu_seqlens)
        cp = parallel.active()
        if cp is not None:
            return self._forward_context_parallel(cp, x, context, mask, causal, block_size, cu_seqlens, positions)
        B, M, N, key_mask, general, cu_q, cu_k = check_mix_inputs(x, context, self.dim, mask, causal, block_size,
                                                                      cu_seqlens)
        if cu_k is not None:
            y = self._forward_packed(x, context, cu_q if cu_q is not None else cu_k, cu_k, causal, block_size,
                                     key_mask, positions, context_positions)
            return y.squeeze(0) if squeeze else y

        q, k, v, _ = self._project(x, context, key_mask)
        if self.rope is not None:
            two_d = self.rope == "2d"
            pos = positions_or_default(positions, B, M, two_d, "positions", x.device)
            cpos = pos if context is None and context_positions is None else \
                positions_or_default(context_positions, B, N, two_d, "context_positions", x.device)
            q, k = self._rotate(q, pos), self._rotate(k, cpos)
        o = self._attend(q, k, v, causal, block_size, key_mask, general)
        return self._merge(o)

    def _forward_context_parallel(self, cp: "parallel.ContextParallel", x: Tensor, context: Optional[Tensor],
                                  mask: Optional[Tensor], causal: bool, block_size: Optional[int],
                                  cu_seqlens: Optional[CuSeqlens], positions: Optional[Tensor]) -> Tensor:
        """This rank's slice of every sequence (:func:`polymixer.context_parallel`). Global attention all-gathers the
        keys and values of every rank (what ring attention sends, in one collective); local attention reads a halo
        of ``window − 1`` tokens from the neighbouring slices and stays O(n·window)."""
        key_mask, lengths = self._cp_agree(cp, x, context, mask, causal, block_size, cu_seqlens, positions)
        sl = parallel.Slice(cp.rank, lengths)
        q, kv, valid = self._cp_project(cp, x, key_mask, sl, positions)
        p = self.dropout if self.training else 0.0
        if self.window is None:
            return self._merge(self._cp_global(cp, q, kv, valid, lengths, sl, causal, block_size, key_mask, p))
        return self._merge(self._cp_local(cp, q, kv, valid, lengths, causal, p))

    def _cp_agree(self, cp: "parallel.ContextParallel", x: Tensor, context: Optional[Tensor], mask: Optional[Tensor],
                  causal: bool, block_size: Optional[int], cu_seqlens: Optional[CuSeqlens],
                  positions: Optional[Tensor]) -> Tuple[Optional[Tensor], List[int]]:
        """(key mask, every rank's slice length) once every rank has checked its call and they agree on the mode
        (one collective, :func:`polymixer.ops.parallel.agree`); else the same ValueError on every rank."""
        problem, key_mask = None, None
        try:
            if context is not None or cu_seqlens is not None:
                raise ValueError("cross-attention and packed sequences cannot be split across ranks")
            _, _, _, key_mask, general, _, _ = check_mix_inputs(x, None, self.dim, mask, causal, block_size, None)
            if general is not None:
                raise ValueError("an explicit (B, M, N) mask cannot be split: use key padding or (block-)causal")
            if self.rope == "2d" and positions is None:
                raise ValueError("2-D rotary needs this slice's explicit (row, col) positions")
            if self.window is not None and block_size is not None:
                raise ValueError("local attention has no block-causal mode")
        except (ValueError, TypeError) as e:
            problem = str(e)
        n = x.shape[1] if isinstance(x, Tensor) and x.dim() == 3 else 0
        facts = {"length": n}
        if problem is None:
            facts.update({"batch": x.shape[0], "width": x.shape[-1], "window": self.window or 0,
                          "shift": self.shift_width, **parallel.tensor_facts(x)})
            facts.update(parallel.mode_facts(causal, block_size, key_mask, self.rope, positions, False))
        return key_mask, parallel.agree(cp, "attention", facts, problem)

    def _cp_project(self, cp: "parallel.ContextParallel", x: Tensor, key_mask: Optional[Tensor],
                    sl: "parallel.Slice", positions: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """(queries (B, H, n, dh), keys ‖ values (B, n, H, 2·dh) — the rows the other ranks need —, key weights
        (B, n)) of this slice: the token shift reads the halo before the slice, rotary the global positions."""
        B, n = x.shape[0], x.shape[1]
        q, kv = self._project_flat(x, None)
        if self.shift_width:  # the W − 1 key / value projections before this slice, from the ranks before it
            take = min(self.shift_width - 1, n)
            tail = kv[:, n - take:]
            if key_mask is not None:
                tail = tail * key_mask[:, n - take:, None].to(tail.dtype)
            prev = parallel.halo_before(tail, self.shift_width - 1, sl, cp, "attention token-shift halo")
            kv = shift_tokens(kv, self.shift, key_mask, prev)[0]
        k, v = kv.split(self.dim, dim=-1)
        q, k, v = heads_view(q, self.heads), heads_view(k, self.heads), heads_view(v, self.heads)
        if self.rope is not None:
            pos = sl.start + torch.arange(n, device=x.device) if positions is None else positions
            check_positions(pos, B, n, self.rope == "2d", "positions")
            q, k = self._rotate(q, pos), self._rotate(k, pos)
        kv = torch.cat([k, v], dim=-1).transpose(1, 2)  # (B, n, H, 2·dh): the rows the other ranks need
        valid = torch.ones(B, n, dtype=kv.dtype, device=x.device) if key_mask is None else key_mask.to(kv.dtype)
        return q, kv, valid

    def _cp_global(self, cp: "parallel.ContextParallel", q: Tensor, kv: Tensor, valid: Tensor, lengths: List[int],
                   sl: "parallel.Slice", causal: bool, block_size: Optional[int], key_mask: Optional[Tensor],
                   p: float) -> Tensor:
        """Global attention of this slice's queries (B, H, n, dh) over every rank's keys and values, gathered."""
        n, dh, device = q.shape[2], self.head_dim, q.device
        rows, zero = parallel.gather_rows(kv, cp, lengths, "attention keys and values")
        if causal and block_size is None and key_mask is None:
            # the keys up to this slice's end; each query sees those up to its own global index: causal,
            # aligned to the bottom right (SDPA's fused kernels take it without a mask on a GPU)
            from torch.nn.attention.bias import causal_lower_right

            K = torch.cat([zero] + rows[:cp.rank + 1], dim=1).transpose(1, 2)
            bias = causal_lower_right(n, K.shape[2])
            return F.scaled_dot_product_attention(q, K[..., :dh], K[..., dh:], attn_mask=bias, dropout_p=p)
        keep, _ = parallel.gather_rows(valid, cp, lengths, "attention key padding")
        K = torch.cat([zero] + rows, dim=1).transpose(1, 2)  # (B, H, N, 2·dh)
        km = torch.cat(keep, dim=1) > 0
        gi = sl.start + torch.arange(n, device=device)
        j = torch.arange(sl.total, device=device)
        vis = torch.ones(n, sl.total, dtype=torch.bool, device=device)
        if causal:
            vis = j[None, :] <= last_visible(n, sl.total, block_size, device, gi, sl.total)[:, None]
        vis = vis[None] & km[:, None, :]
        return sdpa(q, K[..., :dh], K[..., dh:], vis[:, None], p)

    def _cp_local(self, cp: "parallel.ContextParallel", q: Tensor, kv: Tensor, valid: Tensor, lengths: List[int],
                  causal: bool, p: float) -> Tensor:
        """Local attention of this slice's queries (B, H, n, dh): the window − 1 tokens before the slice (and after
        it, bidirectional) from the other ranks, one halo of every rank's first and last rows."""
        W, dh = self.window, self.head_dim
        h = W - 1
        n = q.shape[2]
        take = min(h, n)
        edge = torch.cat([kv[:, :take], kv[:, n - take:]], dim=1)  # first and last rows
        edge_valid = torch.cat([valid[:, :take], valid[:, n - take:]], dim=1)
        lens = [2 * min(h, m) for m in lengths]
        rows, zero = parallel.gather_rows(edge, cp, lens, "local-attention halo")
        keep, _ = parallel.gather_rows(edge_valid, cp, lens, "local-attention halo padding")
        half = [m // 2 for m in lens]
        before = torch.cat([zero] + [rows[r][:, half[r]:] for r in range(cp.rank)], dim=1)[:, -h:] if h else \
            kv[:, :0]
        vb = torch.cat([valid[:, :0]] + [keep[r][:, half[r]:] for r in range(cp.rank)], dim=1)[:, -h:] if h else \
            valid[:, :0]
        after = kv[:, :0]
        va = valid[:, :0]
        if not causal and h:
            after = torch.cat([zero] + [rows[r][:, :half[r]] for r in range(cp.rank + 1, cp.world)], dim=1)[:, :h]
            va = torch.cat([valid[:, :0]] + [keep[r][:, :half[r]] for r in range(cp.rank + 1, cp.world)],
                           dim=1)[:, :h]
        ext = torch.cat([before, kv, after], dim=1).transpose(1, 2)  # (B, H, nb + n + na, 2·dh)
        ext_valid = torch.cat([vb, valid, va], dim=1) > 0
        nb_ = before.shape[1]
        qe = F.pad(q, (0, 0, nb_, after.shape[1]))
        o = _local_attention(qe, ext[..., :dh], ext[..., dh:], W, causal, ext_valid, p)
        return o[:, :, nb_:nb_ + n]

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, block_size: Optional[int],
                key_mask: Optional[Tensor], general: Optional[Tensor]) -> Tensor:
        B, _, M, _ = q.shape
        N = k.shape[2]
        p = self.dropout if self.training else 0.0
        if self.window is not None and general is None and block_size is None and M == N:
            return _local_attention(q, k, v, self.window, causal, key_mask, p)
        if general is None and key_mask is None and block_size is None and self.window is None:
            return sdpa(q, k, v, None, p, is_causal=causal)
        vis = torch.ones(M, N, dtype=torch.bool, device=q.device)
        if causal:
            vis = pattern_mask(M, N, block_size, q.device)
        if self.window is not None:
            i = torch.arange(M, device=q.device)[:, None]
            j = torch.arange(N, device=q.device)[None, :]
            vis = vis & ((j > i - self.window) if causal else ((i - j).abs() < self.window))
        vis = vis.expand(B, M, N)
        if key_mask is not None:
            vis = vis & key_mask[:, None, :]
        if general is not None:
            vis = vis & general
        return sdpa(q, k, v, vis[:, None], p)

    def _forward_packed(self, x: Tensor, context: Optional[Tensor], cu_q: Tensor, cu_k: Tensor, causal: bool,
                        block_size: Optional[int], key_mask: Optional[Tensor], positions: Optional[Tensor],
                        context_positions: Optional[Tensor]) -> Tensor:
        """Packed sequences (validated): one attention call per sequence (attention cost is per sequence anyway)."""
        outs = []
        bq, bk = cu_q.tolist(), cu_k.tolist()
        tok = -2 if self.rope == "2d" else -1  # the token axis of positions

        def part(t: Optional[Tensor], bounds: list, s: int, dim: int = 1) -> Optional[Tensor]:
            return None if t is None else t.narrow(dim, bounds[s], bounds[s + 1] - bounds[s])

        for s in range(len(bq) - 1):
            outs.append(self.forward(part(x, bq, s), part(context, bk, s), mask=part(key_mask, bk, s), causal=causal,
                                     block_size=block_size, positions=part(positions, bq, s, tok),
                                     context_positions=part(context_positions, bk, s, tok)))
        return torch.cat(outs, dim=1)

    # -- streaming ------------------------------------------------------------------------------------------------

    def init_state(self, batch_size: int, device: Optional[torch.device] = None,
                   dtype: Optional[torch.dtype] = None) -> AttentionState:
        """An empty KV cache: a ring buffer of ``window`` slots for local attention, else a growing cache."""
        check_batch_size(batch_size)
        device = self.qkv.weight.device if device is None else device
        dtype = self.qkv.weight.dtype if dtype is None else dtype
        cap = self.window or 0
        prev = None if not self.shift_width else torch.zeros(batch_size, self.shift_width - 1, 2 * self.dim,
                                                             device=device, dtype=dtype)
        return AttentionState(
            k=torch.zeros(batch_size, self.heads, cap, self.head_dim, device=device, dtype=dtype),
            v=torch.zeros(batch_size, self.heads, cap, self.head_dim, device=device, dtype=dtype),
            index=torch.full((batch_size, cap), -1, dtype=torch.int64, device=device),
            valid=torch.zeros(batch_size, cap, dtype=torch.bool, device=device),
            offset=torch.zeros(batch_size, dtype=torch.int64, device=device),
            window=self.window,
            shift_prev=prev,
        )

    def step(self, x: Tensor, state: AttentionState, causal: bool = True, positions: Optional[Tensor] = None,
             mask: Optional[Tensor] = None) -> Tuple[Tensor, AttentionState]:
        """Consume a chunk with the KV cache: (y, state). Same contract as :meth:`polymixer.PoM.step`."""
        if not isinstance(state, AttentionState):
            raise TypeError(f"state must be an AttentionState (from init_state), got {type(state).__name__}")
        check_tokens(x, self.dim, "x")
        B, T, _ = x.shape
        if state.batch_size != B:
            raise ValueError(f"state holds batch {state.batch_size} but x has batch {B}; index or re-initialise it")
        if state.window != self.window:
            raise ValueError(f"state was made for window={state.window}, this layer has window={self.window}")
        if mask is not None:
            check_bool_mask(mask, [(B, T)], f"a chunk of batch {B} × {T} tokens")
        if (state.shift_prev is None) != (not self.shift_width):
            raise ValueError(f"state was made for a layer {'with' if state.shift_prev is not None else 'without'} a "
                             f"token shift; this layer has {self.shift_width or 'none'}: use its init_state")
        q, k, v, last = self._project(x, None, mask, state.shift_prev)
        if self.shift_width:
            state.shift_prev = last
        idx = state.offset[:, None] + torch.arange(T, device=x.device)  # (B, T) stream indices
        if self.rope is not None:
            if positions is None:
                if self.rope == "2d":
                    raise ValueError("2-D rotary streaming needs explicit positions of shape (B, T, 2) or (T, 2)")
                positions = idx
            check_positions(positions, B, T, self.rope == "2d", "positions")
            q, k = self._rotate(q, positions), self._rotate(k, positions)
        valid_new = torch.ones(B, T, dtype=torch.bool, device=x.device) if mask is None else mask

        if causal and mask is None and state.filled == 0 and T > 1:
            # prefill of a fresh stream: the parallel kernels (causal SDPA, or blockwise sliding window), never T×T
            if self.window is None:
                o = sdpa(q, k, v, None, is_causal=True)
                self._append(state, k, v, idx, valid_new)
            else:
                o = _local_attention(q, k, v, self.window, True, None, 0.0)
                self._ring_write(state, k, v, idx, valid_new)
            state.offset = state.offset + T
            return self._merge(o), state

        if state.window is None:
            self._append(state, k, v, idx, valid_new)
            keys, vals = state.k[:, :, : state.filled], state.v[:, :, : state.filled]
            kidx, kvalid = state.index[:, : state.filled], state.valid[:, : state.filled]
        else:
            keys = torch.cat([state.k, k], dim=2)
            vals = torch.cat([state.v, v], dim=2)
            kidx = torch.cat([state.index, idx], dim=1)
            kvalid = torch.cat([state.valid, valid_new], dim=1)
        qi, kj = idx[:, :, None], kidx[:, None, :]
        vis = kvalid[:, None, :] & (kj >= 0)
        if causal:
            vis = vis & (kj <= qi)
        if self.window is not None:
            vis = vis & (kj > qi - self.window)
            if not causal:
                vis = vis & (kj < qi + self.window)
        o = sdpa(q, keys, vals, vis[:, None])
        if state.window is not None:
            self._ring_write(state, k, v, idx, valid_new)
        state.offset = state.offset + T
        return self._merge(o), state

    @staticmethod
    def _append(state: AttentionState, k: Tensor, v: Tensor, idx: Tensor, valid: Tensor) -> None:
        T = k.shape[2]
        need = state.filled + T
        cap = state.k.shape[2]
        if need > cap:  # grow geometrically: amortised O(1) per token
            new_cap = max(need, 2 * cap, 16)
            grow = new_cap - cap
            state.k = F.pad(state.k, (0, 0, 0, grow))
            state.v = F.pad(state.v, (0, 0, 0, grow))
            state.index = F.pad(state.index, (0, grow), value=-1)
            state.valid = F.pad(state.valid, (0, grow), value=False)
        sl = slice(state.filled, need)
        state.k[:, :, sl] = k
        state.v[:, :, sl] = v
        state.index[:, sl] = idx
        state.valid[:, sl] = valid
        state.filled = need

    @staticmethod
    def _ring_write(state: AttentionState, k: Tensor, v: Tensor, idx: Tensor, valid: Tensor) -> None:
        W = state.window
        T = k.shape[2]
        keep = min(T, W)  # only the last `window` tokens of the chunk can ever be seen again
        slots = (state.ptr + torch.arange(keep, device=k.device)) % W
        state.k[:, :, slots] = k[:, :, T - keep:]
        state.v[:, :, slots] = v[:, :, T - keep:]
        state.index[:, slots] = idx[:, T - keep:]
        state.valid[:, slots] = valid[:, T - keep:]
        state.ptr = (state.ptr + keep) % W
        state.filled = min(W, state.filled + keep)


class LocalAttention(Attention):
    """Sliding-window (local) attention: each query sees the keys within ``window`` tokens of it — causal: the last
    ``window`` tokens, itself included; bidirectional: |i − j| < window (block-wise and a ring buffer: the module doc).

    Args: ``window`` (a positive int, required) and any keyword of :class:`Attention`.
    """

    def __init__(self, dim: int, window: int, **options: Any) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"LocalAttention's window must be a positive int (global attention is Attention), got "
                             f"{window!r}")
        super().__init__(dim, **options)
        self.window = window
