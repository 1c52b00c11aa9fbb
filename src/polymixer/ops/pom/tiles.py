"""The tiles of PoM's Triton kernels: for each route, rotary or not, and gate-head class, the (tokens per chunk,
channels per program) of every kernel — what ``polymixer kernels`` builds without register spills. Pure data (no
Triton), read by the kernels' host side and by the cost model (:mod:`polymixer.ops.cost`)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

__all__ = ["ROLES", "TILES", "head_class"]

ROLES = ("causal_walk", "causal_backward", "walk", "gate", "group", "end")
# The kernels of a call by role: the causal walk and its backward (one chunk length: the backward reads the carries
# the walk saves per chunk), and the end-token modes' walk, gate kernel and backward walks (group: the gradients of
# the end sums, end: their reverse walk). (fused route, rotary, gate-head class) → role → (BLOCK_N, BLOCK_D) — the
# longest chunk, then the widest channel tile, that ``polymixer kernels`` builds for sm_80 and sm_90 at degree 5 with
# every flag on, 4 warps, without register spills (so ≥ 2 CTAs per SM: registers × threads ≤ 32,768); None where
# none does (the call then runs elsewhere). The gate-head class is the head width rounded up to 16 … 128; a tile
# holds whole heads, and with rotary both halves of each of its BLOCK_D channel pairs.
TILES: Dict[Tuple[bool, bool, int], Dict[str, Optional[Tuple[int, int]]]] = {
    (False, False, 16): dict(causal_walk=(32, 32), causal_backward=(32, 32), walk=(64, 32), gate=(64, 32),
                             group=(64, 32), end=(64, 32)),
    (False, False, 32): dict(causal_walk=(32, 32), causal_backward=(32, 32), walk=(64, 32), gate=(64, 32),
                             group=(64, 32), end=(64, 32)),
    (False, False, 64): dict(causal_walk=(32, 64), causal_backward=(32, 64), walk=(64, 64), gate=(64, 64),
                             group=(32, 64), end=(32, 64)),
    (False, False, 128): dict(causal_walk=(8, 128), causal_backward=(8, 128), walk=(32, 128), gate=(32, 128),
                              group=(32, 128), end=(16, 128)),
    (False, True, 16): dict(causal_walk=(32, 16), causal_backward=(32, 16), walk=(64, 16), gate=(64, 16),
                            group=(64, 16), end=(64, 16)),
    (False, True, 32): dict(causal_walk=(16, 32), causal_backward=(16, 32), walk=(32, 32), gate=(64, 32),
                            group=(32, 32), end=(16, 32)),
    (False, True, 64): dict(causal_walk=(16, 64), causal_backward=(16, 64), walk=(16, 64), gate=(32, 64),
                            group=(16, 64), end=(16, 64)),
    (False, True, 128): dict(causal_walk=(8, 128), causal_backward=None, walk=(8, 128), gate=(16, 128),
                             group=(16, 128), end=None),
    (True, False, 16): dict(causal_walk=(32, 64), causal_backward=(32, 16), walk=(32, 64), gate=(64, 64),
                            group=(64, 16), end=(64, 16)),
    (True, False, 32): dict(causal_walk=(32, 64), causal_backward=(32, 64), walk=(64, 64), gate=(64, 64),
                            group=(64, 32), end=(64, 32)),
    (True, False, 64): dict(causal_walk=(32, 64), causal_backward=(32, 64), walk=(64, 64), gate=(64, 64),
                            group=(32, 64), end=(32, 64)),
    (True, False, 128): dict(causal_walk=(32, 128), causal_backward=None, walk=(32, 128), gate=(32, 128),
                             group=(32, 128), end=(16, 128)),
    (True, True, 16): dict(causal_walk=(64, 16), causal_backward=None, walk=(64, 16), gate=(64, 16),
                           group=(32, 16), end=(32, 16)),
    (True, True, 32): dict(causal_walk=(16, 32), causal_backward=(16, 32), walk=(16, 32), gate=(32, 32),
                           group=(16, 32), end=(16, 32)),
    (True, True, 64): dict(causal_walk=(16, 64), causal_backward=None, walk=(16, 64), gate=(32, 64),
                           group=(16, 64), end=(16, 64)),
    (True, True, 128): dict(causal_walk=None, causal_backward=None, walk=None, gate=(16, 128), group=None,
                            end=None),
}
for _tiles in TILES.values():  # the causal walk and its backward share their chunks
    assert _tiles["causal_backward"] is None or _tiles["causal_walk"][0] == _tiles["causal_backward"][0]


def head_class(G: int) -> int:
    """The gate-head class of :data:`TILES`: a head of G channels rounded up to a power of two in 16 … 128."""
    return max(16, 1 << max(0, (G - 1).bit_length()))
