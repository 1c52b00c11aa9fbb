"""Position encodings: fixed sin-cos (1-D and 2-D), and grid coordinates for 2-D rotary.

Rotary positions themselves are applied inside the mixers (``rope="1d" | "2d"``); the angle tables and the rotation
are the pure functions :func:`polymixer.functional.rope_angles` and :func:`polymixer.functional.rotate`.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..functional import rope_angles, rotate

__all__ = ["sincos_1d", "sincos_2d", "grid_positions", "rope_angles", "rotate"]


def sincos_1d(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Transformer sin-cos features (…, dim) of (…) positions: [sin(p·ω), cos(p·ω)], ω_i = base^(−2i/dim)."""
    if dim % 2:
        raise ValueError(f"sin-cos positions need an even dim, got {dim}")
    omega = base ** (-torch.arange(dim // 2, dtype=torch.float64, device=positions.device) / (dim / 2))
    ang = positions.to(torch.float64).unsqueeze(-1) * omega
    return torch.cat([ang.sin(), ang.cos()], dim=-1).float()


def grid_positions(height: int, width: int, device: Optional[torch.device] = None) -> Tensor:
    """(height·width, 2) integer (row, col) coordinates in row-major order — the 2-D rotary positions of a grid."""
    rows = torch.arange(height, device=device).repeat_interleave(width)
    cols = torch.arange(width, device=device).repeat(height)
    return torch.stack([rows, cols], dim=-1)


def sincos_2d(height: int, width: int, dim: int) -> Tensor:
    """DiT's fixed 2-D sin-cos embedding (height·width, dim): half the channels encode the row, half the column."""
    if dim % 4:
        raise ValueError(f"2-D sin-cos positions need dim divisible by 4, got {dim}")
    g = grid_positions(height, width)
    # DiT/MAE order: the first half encodes the column (w), the second the row (h)
    return torch.cat([sincos_1d(g[:, 1], dim // 2), sincos_1d(g[:, 0], dim // 2)], dim=-1)
