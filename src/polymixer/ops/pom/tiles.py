"""The tiles of PoM's Triton kernels: for each route, rotary or not, and gate-head class, the tokens per chunk and the
channels per program of every kernel — what ``polymixer kernels`` builds without register spills. Pure data (no
Triton), read by the kernels' host side and by the bench's roofline model
(:mod:`polymixer.experiments.bench.roofline`)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

__all__ = ["ROLES", "TILES", "head_class"]

ROLES = ("sums", "apply", "grad_sums", "grad_apply")
# The parallel kernels of a call by role: the forward's chunk sums and apply, the backward's chunk sums of the gated
# gradient and its apply (the scan between them has a tile of its own). (fused route, rotary, gate-head class) →
# role → (BLOCK_N, BLOCK_D): the chunk (one length for every kernel of a call: the tables hold one row per chunk)
# and the channel tile that ``polymixer kernels`` builds for sm_80 and sm_90 at degree 5 with every flag on (key
# padding, positions, packing; causal and block-causal), 4 warps, without register spills (so ≥ 2 CTAs per SM:
# registers × threads ≤ 32,768) — the longest chunk first, then the widest tile; None where none does (the call then
# runs elsewhere). The unfused route's tiles are built with fp32 activations and gelu, and were also searched at the
# light flags of the models' usual training call (degree 2, leaky-clamp, no padding, positions or packing, bf16):
# those fit no wider tiles (the chunk's running sums and scans bind the registers, not the flags), so one set serves
# every call. The unfused kernels take a gate head of any width in any tile (a head wider than the tile is
# split over programs), so they have one entry per rotary choice, under class 16; the fused route computes the gate
# as a product per head, so its tiles hold whole heads: the gate-head class is the head width rounded up to
# 16 … 128. With rotary a tile holds both halves of each of its BLOCK_D channel pairs.
_Tile = Optional[Tuple[int, int]]


def _tiles(chunk: int, sums: int, apply: int, grad_sums: int, grad_apply: Optional[int]) -> Dict[str, _Tile]:
    return dict(sums=(chunk, sums), apply=(chunk, apply), grad_sums=(chunk, grad_sums),
                grad_apply=None if grad_apply is None else (chunk, grad_apply))


TILES: Dict[Tuple[bool, bool, int], Dict[str, _Tile]] = {
    (False, False, 16): _tiles(64, 32, 32, 32, 16),  # every gate head, the unfused route
    (False, True, 16): _tiles(32, 32, 16, 16, 16),
    (True, False, 16): _tiles(64, 64, 32, 32, 16),
    (True, False, 32): _tiles(64, 64, 64, 64, 32),
    (True, False, 64): _tiles(32, 64, 128, 128, 64),
    (True, False, 128): _tiles(8, 128, 128, 128, 128),
    (True, True, 16): _tiles(16, 64, 32, 32, 32),
    (True, True, 32): _tiles(16, 64, 64, 64, 32),
    (True, True, 64): _tiles(8, 128, 64, 128, 64),
    (True, True, 128): dict(sums=None, apply=None, grad_sums=None, grad_apply=None),
}
for _tiles_of_key in TILES.values():  # one chunk length per call
    assert len({t[0] for t in _tiles_of_key.values() if t is not None}) <= 1


def head_class(G: int) -> int:
    """The gate-head class of :data:`TILES`: a head of G channels rounded up to a power of two in 16 … 128."""
    return max(16, 1 << max(0, (G - 1).bit_length()))
