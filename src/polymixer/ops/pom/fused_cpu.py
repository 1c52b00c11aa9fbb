"""The ``cpu`` backend of PoM: self-mixing, full or causal (rotary allowed), walked in cache-sized tiles."""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..common import (
    ACTIVATIONS,
    GATES,
    GATES_INPLACE,
    compute_dtype,
    elementwise_backward,
    is_compiling,
    rope_angles,
    rotate,
)
from ..call import Call
from ..features import chunked_cumsum, horner, horner_derivative
from .call import PomWeights

__all__ = ["supports", "forward", "slice_sum", "mix_with_carry"]

#
# On CPU the modular path's cost above the matrix products is not arithmetic but memory: every fresh (B, N, D)
# buffer is a new mapping that page-faults on first touch. The fused path walks the fused projection z in tiles of
# ~512 tokens that stay in cache, never materialises per-token features, and — like FlashAttention — saves only z
# (plus a (B, N/512, D) table of running sums) for a backward that recomputes everything else tile by tile. Without
# autograd it even writes its result into z's own polynomial half, so inference allocates nothing of size (B, N, D).

_TILE = 512


def _tiles(B: int, N: int):
    """(b0, b1, n0, n1, j): row-range × token-range tiles of about _TILE tokens; j is the tile's index in its row."""
    if N >= _TILE:
        for b in range(B):
            for j, n0 in enumerate(range(0, N, _TILE)):
                yield b, b + 1, n0, min(N, n0 + _TILE), j
    else:
        bt = max(1, _TILE // N)
        for b0 in range(0, B, bt):
            yield b0, min(B, b0 + bt), 0, N, 0


def _gate_times(s: Tensor, h: Tensor) -> Tensor:
    """s ⊙ h with s of width Ds (one scalar per head when Ds < D)."""
    D, Ds = h.shape[-1], s.shape[-1]
    if Ds == D:
        return s * h
    hv = h.reshape(*h.shape[:-1], Ds, D // Ds)
    return (s.unsqueeze(-1) * hv).flatten(-2)


def _head_sum(g: Tensor, Ds: int) -> Tensor:
    D = g.shape[-1]
    return g if Ds == D else g.view(*g.shape[:-1], Ds, D // Ds).sum(-1)


class _ProjectedTiles:
    """Tiles of the fused projection z = [W_h x; W_s x] from a materialised z (training: autograd keeps z)."""

    def __init__(self, z: Tensor, D: int) -> None:
        self.z, self.D = z, D

    def poly_part(self, t: Tuple[int, int, int, int]) -> Tensor:
        return self.z[t[0]:t[1], t[2]:t[3], : self.D]

    def gate_part(self, t: Tuple[int, int, int, int]) -> Tensor:
        return self.z[t[0]:t[1], t[2]:t[3], self.D:]

    def both(self, t: Tuple[int, int, int, int]) -> Tuple[Tensor, Tensor]:
        return self.poly_part(t), self.gate_part(t)


class _InputTiles(_ProjectedTiles):
    """Tiles of z computed on the fly from x (inference): the projections run per tile and z never hits memory."""

    def __init__(self, x: Tensor, weight: Tensor, D: int) -> None:
        self.x, self.w, self.D = x, weight, D

    def poly_part(self, t: Tuple[int, int, int, int]) -> Tensor:
        return F.linear(self.x[t[0]:t[1], t[2]:t[3]], self.w[: self.D])

    def gate_part(self, t: Tuple[int, int, int, int]) -> Tensor:
        return F.linear(self.x[t[0]:t[1], t[2]:t[3]], self.w[self.D:])

    def both(self, t: Tuple[int, int, int, int]) -> Tuple[Tensor, Tensor]:
        z = F.linear(self.x[t[0]:t[1], t[2]:t[3]], self.w)  # ONE matrix product for W_h and W_s
        return z[..., : self.D], z[..., self.D:]


Tile = Tuple[int, int, int, int]
Rot = Optional[Tuple[Tensor, Tensor]]


class _Plan:
    """Everything the fused tiles share: coefficients, gate bias, non-linearities, mode, and rotary tables."""

    def __init__(self, coeff: Tensor, bias: Tensor, causal: bool, act: str, gate: str, mean: bool, rot: Rot,
                 cd: torch.dtype, carry: Optional[Tensor] = None, count: Optional[Tensor] = None) -> None:
        self.D = coeff.shape[0]
        self.carry, self.count = carry, count
        self.rows = coeff.to(cd).t().contiguous()
        self.bias = bias.to(cd)
        self.causal, self.mean, self.cd = causal, mean, cd
        self.act_fn, self.act_d = ACTIVATIONS[act]
        self.gate_fn, self.gate_d = GATES[gate]
        self.gate_ip = GATES_INPLACE[gate]
        self.rot = rot  # (cos, sin) of shape (N, D/2) or (B, N, D/2), or None

    def _cs(self, t: Tile) -> Tuple[Tensor, Tensor]:
        cos, sin = self.rot  # type: ignore[misc]
        if cos.dim() == 3:
            return cos[t[0]:t[1], t[2]:t[3]], sin[t[0]:t[1], t[2]:t[3]]
        return cos[t[2]:t[3]], sin[t[2]:t[3]]

    def rotate(self, x: Tensor, t: Tile) -> Tensor:
        """R(pos) x for the tokens of tile t (identity without rotary)."""
        return x if self.rot is None else rotate(x, *self._cs(t))

    def unrotate(self, x: Tensor, t: Tile) -> Tensor:
        """R(pos)ᵀ x = R(−pos) x."""
        return x if self.rot is None else rotate(x, *self._cs(t), inverse=True)


def _inverse_counts(plan: "_Plan", B: int, N: int, dev: torch.device) -> Tensor:
    """1 / (visible tokens) of every query: (N, 1), or (B, N, 1) after a carried-in count (context parallelism)."""
    ar = torch.arange(1, N + 1, dtype=plan.cd, device=dev)
    if plan.count is None:
        return (1.0 / ar).unsqueeze(-1)
    return (1.0 / (plan.count.to(plan.cd).unsqueeze(1) + ar)).unsqueeze(-1)


def _inv_tile(inv: Tensor, t: Tile) -> Tensor:
    return inv[t[2]:t[3]] if inv.dim() == 2 else inv[t[0]:t[1], t[2]:t[3]]


def _fused_forward(src: _ProjectedTiles, B: int, N: int, plan: _Plan, put: Callable[[Tile, Tensor], None]) -> Tensor:
    """Hand gate ⊙ H to ``put`` tile by tile; returns what the backward needs besides z:
    H (B, D) in full mode, the running sum at the start of every tile (B, tiles, D) in causal mode.

    ``plan.carry`` (B, D), when given, is a sum of tokens outside this call that every query sees (the ranks
    before this one under context parallelism, or all the others in full mode), and ``plan.count`` (B,) the
    number of tokens it counts (full mode: the total count the mean divides by)."""
    D, cd, dev = plan.D, plan.cd, plan.rows.device
    if not plan.causal:
        H = torch.zeros(B, D, dtype=cd, device=dev) if plan.carry is None else plan.carry.to(cd).clone()
        for b0, b1, n0, n1, _ in _tiles(B, N):
            t = (b0, b1, n0, n1)
            H[b0:b1] += plan.rotate(horner(plan.act_fn(src.poly_part(t).to(cd)), plan.rows), t).sum(1)
        if plan.mean:
            H /= N if plan.count is None else plan.count.to(cd).unsqueeze(-1)
        for b0, b1, n0, n1, _ in _tiles(B, N):
            t = (b0, b1, n0, n1)
            s = plan.gate_ip(src.gate_part(t).to(cd) + plan.bias)
            h = H[b0:b1, None] if plan.rot is None else plan.unrotate(H[b0:b1, None].expand(b1 - b0, n1 - n0, D), t)
            put(t, _gate_times(s, h))
        return H
    ntiles = -(-N // _TILE) if N >= _TILE else 1
    carries = torch.zeros(B, ntiles, D, dtype=cd, device=dev)
    if plan.carry is not None:
        carries[:, 0] = plan.carry.to(cd)
    inv = _inverse_counts(plan, B, N, dev)
    for b0, b1, n0, n1, j in _tiles(B, N):
        t = (b0, b1, n0, n1)
        zh, zs = src.both(t)
        carried = carries[b0:b1, j] if j or plan.carry is not None else None  # added with the chunks' own carries
        c = chunked_cumsum(plan.rotate(horner(plan.act_fn(zh.to(cd)), plan.rows), t), reverse=False, initial=carried)
        if j + 1 < ntiles:
            carries[b0:b1, j + 1] = c[:, -1]
        if plan.mean:
            c *= _inv_tile(inv, t)
        s = plan.gate_ip(zs.to(cd) + plan.bias)
        put(t, _gate_times(s, plan.unrotate(c, t)))
    return carries


def _poly_grads(plan: _Plan, grad_rows: Tensor, zh: Tensor, h: Tensor, gp: Tensor) -> Tensor:
    """Accumulate dL/dα (into ``grad_rows`` (k, D)) from dL/dp ``gp`` of one tile and return its dL/dz_h."""
    hp = h
    for p in range(grad_rows.shape[0]):
        grad_rows[p] += (gp * hp).sum((0, 1))
        if p + 1 < grad_rows.shape[0]:
            hp = hp * h
    return elementwise_backward(plan.act_fn, plan.act_d, zh, gp * horner_derivative(h, plan.rows))


class _FusedSelfMix(torch.autograd.Function):
    """z = [W_h x; W_s x] → gate(z_s + b) ⊙ H(poly(act(z_h))), full or causal, saving only z (and rotary tables)."""

    @staticmethod
    def forward(ctx, z: Tensor, coeff: Tensor, bias: Tensor, cos: Optional[Tensor], sin: Optional[Tensor],  # type: ignore[override]
                causal: bool, act: str, gate: str, mean: bool, carry: Optional[Tensor] = None,
                count: Optional[Tensor] = None):
        B, N, _ = z.shape
        plan = _Plan(coeff, bias, causal, act, gate, mean, None if cos is None else (cos, sin),
                     compute_dtype(z.dtype), carry, count)
        out = torch.empty(B, N, plan.D, dtype=z.dtype, device=z.device)

        def put(t: Tile, g: Tensor) -> None:
            out[t[0]:t[1], t[2]:t[3]] = g

        aux = _fused_forward(_ProjectedTiles(z, plan.D), B, N, plan, put)
        ctx.save_for_backward(z, coeff, bias, aux, cos, sin, count)
        ctx.cfg = (causal, act, gate, mean, carry is not None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        z, coeff, bias, aux, cos, sin, count = ctx.saved_tensors
        causal, act, gate, mean, has_carry = ctx.cfg
        B, N, _ = z.shape
        cd = compute_dtype(z.dtype)
        plan = _Plan(coeff, bias, causal, act, gate, mean, None if cos is None else (cos, sin), cd, None, count)
        D, k = coeff.shape
        Ds = z.shape[-1] - D
        rows = plan.rows
        grad_z = torch.empty_like(z)
        grad_bias = torch.zeros(Ds, dtype=cd, device=z.device)
        grad_rows = torch.zeros(k, D, dtype=cd, device=z.device)

        if not causal:
            H = aux  # (B, D), rotated frame
            gH = torch.zeros(B, D, dtype=cd, device=z.device)
            for b0, b1, n0, n1, _ in _tiles(B, N):
                t = (b0, b1, n0, n1)
                u = z[b0:b1, n0:n1, D:].to(cd) + plan.bias
                g = grad[b0:b1, n0:n1].to(cd)
                Hq = H[b0:b1, None] if plan.rot is None else plan.unrotate(H[b0:b1, None].expand(b1 - b0, n1 - n0, D),
                                                                          t)
                gH[b0:b1] += plan.rotate(_gate_times(plan.gate_fn(u), g), t).sum(1)
                gu = elementwise_backward(plan.gate_fn, plan.gate_d, u, _head_sum(g * Hq, Ds))
                grad_bias += gu.sum((0, 1))
                grad_z[b0:b1, n0:n1, D:] = gu
            if mean:
                gH /= N if count is None else count.to(cd).unsqueeze(-1)
            grad_carry = gH
            for b0, b1, n0, n1, _ in _tiles(B, N):
                t = (b0, b1, n0, n1)
                zh = z[b0:b1, n0:n1, :D].to(cd)
                gp = plan.unrotate(gH[b0:b1, None].expand(b1 - b0, n1 - n0, D), t)
                grad_z[b0:b1, n0:n1, :D] = _poly_grads(plan, grad_rows, zh, plan.act_fn(zh), gp)
        else:
            carries = aux
            inv = _inverse_counts(plan, B, N, z.device)
            suffix = torch.zeros(B, D, dtype=cd, device=z.device)
            for b0, b1, n0, n1, j in reversed(list(_tiles(B, N))):
                t = (b0, b1, n0, n1)
                zh = z[b0:b1, n0:n1, :D].to(cd)
                h = plan.act_fn(zh)
                c = chunked_cumsum(plan.rotate(horner(h, rows), t), reverse=False,
                                   initial=carries[b0:b1, j] if j or has_carry else None)
                if mean:
                    c *= _inv_tile(inv, t)
                u = z[b0:b1, n0:n1, D:].to(cd) + plan.bias
                g = grad[b0:b1, n0:n1].to(cd)
                gu = elementwise_backward(plan.gate_fn, plan.gate_d, u, _head_sum(g * plan.unrotate(c, t), Ds))
                grad_bias += gu.sum((0, 1))
                grad_z[b0:b1, n0:n1, D:] = gu
                gc = plan.rotate(_gate_times(plan.gate_fn(u), g), t)
                if mean:
                    gc *= _inv_tile(inv, t)
                gp = chunked_cumsum(gc, reverse=True)
                gp += suffix[b0:b1, None]
                suffix[b0:b1] = gp[:, 0]
                grad_z[b0:b1, n0:n1, :D] = _poly_grads(plan, grad_rows, zh, h, plan.unrotate(gp, t))
            grad_carry = suffix  # every query's sum holds the carried-in sum: the gradient of all of them
        return (grad_z, grad_rows.t().to(coeff.dtype), grad_bias.to(bias.dtype), None, None, None, None, None,
                None, grad_carry if has_carry else None, None)


class _FusedSum(torch.autograd.Function):
    """Σ_tokens R(pos) poly(act(z_h)) per row (B, D) in tiles, saving only z: what a rank's slice adds to the
    others' aggregates under context parallelism."""

    @staticmethod
    def forward(ctx, z: Tensor, coeff: Tensor, cos: Optional[Tensor], sin: Optional[Tensor], act: str  # type: ignore[override]
                ) -> Tensor:
        B, N, _ = z.shape
        cd = compute_dtype(z.dtype)
        plan = _Plan(coeff, coeff.new_zeros(1), False, act, "identity", False, None if cos is None else (cos, sin),
                     cd)
        total = torch.zeros(B, plan.D, dtype=cd, device=z.device)
        for b0, b1, n0, n1, _ in _tiles(B, N):
            t = (b0, b1, n0, n1)
            total[b0:b1] += plan.rotate(horner(plan.act_fn(z[b0:b1, n0:n1, :plan.D].to(cd)), plan.rows), t).sum(1)
        ctx.save_for_backward(z, coeff, cos, sin)
        ctx.act = act
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        z, coeff, cos, sin = ctx.saved_tensors
        B, N, _ = z.shape
        cd = compute_dtype(z.dtype)
        plan = _Plan(coeff, coeff.new_zeros(1), False, ctx.act, "identity", False, None if cos is None else
                     (cos, sin), cd)
        D, k = coeff.shape
        grad_z = torch.zeros_like(z)
        grad_rows = torch.zeros(k, D, dtype=cd, device=z.device)
        g = grad.to(cd)
        for b0, b1, n0, n1, _ in _tiles(B, N):
            t = (b0, b1, n0, n1)
            zh = z[b0:b1, n0:n1, :D].to(cd)
            h = plan.act_fn(zh)
            gp = plan.unrotate(g[b0:b1, None].expand(b1 - b0, n1 - n0, D), t)
            grad_z[b0:b1, n0:n1, :D] = _poly_grads(plan, grad_rows, zh, h, gp)
        return grad_z, grad_rows.t().to(coeff.dtype), None, None, None


def slice_sum(z: Tensor, coeff: Tensor, rot: Rot, act: str) -> Tensor:
    """(B, D): the sum over this slice's tokens of their (rotated) polynomial features, differentiable, in tiles
    (the fused path's memory: nothing of size (B, N, D) besides z)."""
    cos, sin = rot if rot is not None else (None, None)
    return _FusedSum.apply(z, coeff, cos, sin, act)


def mix_with_carry(z: Tensor, coeff: Tensor, bias: Tensor, rot: Rot, causal: bool, act: str, gate: str, mean: bool,
                   carry: Tensor, count: Tensor) -> Tensor:
    """gate ⊙ H on the fused path with ``carry`` (B, D) seen by every query (and differentiable) and ``count``
    (B,) the tokens it counts (full mode: the whole count); see :func:`_fused_forward`."""
    cos, sin = rot if rot is not None else (None, None)
    return _FusedSelfMix.apply(z, coeff, bias, cos, sin, causal, act, gate, mean, carry, count)


def supports(call: Call) -> Optional[str]:
    """Self-mixing, full or causal (relative rotary allowed), on CPU tensors, named non-linearities, eager mode."""
    if call.state is not None:
        return "a stream (state=…) runs on the torch form"
    if call.x.device.type != "cpu":
        return f"CPU tensors only (got {call.x.device.type})"
    if not call.self_mix:
        return "self-mixing only (cross-mixing given)"
    for name, value in (("a token shift", call.weights.shift_weight), ("key padding", call.key_mask),
                        ("a (B, M, N) mask", call.mask), ("packed sequences", call.cu_k),
                        ("block-causal masking", call.block_size), ("context_positions", call.context_positions)):
        if value is not None:
            return f"{name} is not fused"
    if not isinstance(call.activation, str) or not isinstance(call.gate, str):
        return "a callable activation or gate is not fused"
    if call.rope is not None and call.rope_convention != "relative":
        return "rope_convention='reference' (PoMRoPE's turned gate) is not fused"
    if is_compiling():
        return "torch.compile traces the modular form"
    return None


def forward(call: Call) -> Tensor:
    """The whole self-mixing PoM of ``call`` on the fused path."""
    rot = None
    if call.rope is not None:
        rot = rope_angles(call.rope_positions()[0], call.D, call.rope_base, call.rope == "2d",
                          compute_dtype(call.x.dtype))
    return _fused_self_mix(call.x, call.weights, call.causal, call.activation, call.gate, call.reduction == "mean",
                           rot)


def _fused_self_mix(x: Tensor, weights: PomWeights, causal: bool, act: str, gate: str, mean: bool, rot: Rot
                    ) -> Tensor:
    """The whole self-mixing PoM on the fused CPU path (``rot``: rotary cos / sin tables of the tokens, or None)."""
    in_weight, coeff, bias = weights.in_weight, weights.coeff, weights.gate_bias
    out_weight, out_bias = weights.out_weight, weights.out_bias
    if torch.is_grad_enabled() and (x.requires_grad or any(p is not None and p.requires_grad for p in weights)):
        z = F.linear(x, in_weight)
        cos, sin = rot if rot is not None else (None, None)
        g = _FusedSelfMix.apply(z, coeff, bias, cos, sin, causal, act, gate, mean)
        return F.linear(g, out_weight, out_bias)
    # inference: per tile, project, mix and project out while the tile is in cache. (In full mode H must be complete
    # before any gate is applied, so the W_h rows run in the first pass and the W_s rows in the second: the same
    # flops as one stacked product, and re-reading x (d wide) costs less than storing z_s (Ds wide).)
    B, N, _ = x.shape
    x = x.contiguous()
    out: List[Tensor] = []

    def put(t: Tile, g: Tensor) -> None:
        yt = F.linear(g.to(x.dtype), out_weight, out_bias)  # dtype as F.linear decides (autocast included)
        if not out:
            out.append(torch.empty(B, N, yt.shape[-1], dtype=yt.dtype, device=x.device))
        out[0][t[0]:t[1], t[2]:t[3]] = yt

    plan = _Plan(coeff, bias, causal, act, gate, mean, rot, compute_dtype(x.dtype))
    _fused_forward(_InputTiles(x, in_weight, plan.D), B, N, plan, put)
    return out[0]

