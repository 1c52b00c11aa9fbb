"""Linear attention: the baselines a recall comparison of sub-quadratic mixers needs, at a chosen state size.

Per head, with q_i, k_j ∈ R^f (feature width f) and v_j ∈ R^{dv/H}:

- ``feature_map="identity"``: φ(u) = u, and the readout Σ_{j visible} (φ(q_i)·φ(k_j)) v_j is RMS-normalised per
  head (q·k may be negative, so the sum of the weights is no safe denominator). State: f × dv/H per head.
- ``feature_map="taylor"`` (Based, Arora et al. 2024): φ(u) = [1, u/f^¼, vec(u ⊗ u)/(√2·√f)], so that
  φ(q)·φ(k) = 1 + q·k/√f + (q·k)²/(2f), the 2nd-order Taylor expansion of exp(q·k/√f), which is always positive.
  The readout is divided by Σ_j φ(q_i)·φ(k_j), like softmax. State: (1 + f + f²) × dv/H per head.

Both run on the value-carrying PoM's chunked form (:func:`polymixer.values.value_mix`), so causal mixing never
builds an N × N tensor. ``token_shift=True`` gives the key and value projections the value-carrying PoM's learned
causal shift (each token mixed with the previous one), the role Based's short convolution plays: with it, a recall
comparison differs only in the feature map and the state.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ..ops import parallel
from ..ops.common import check_mix_inputs
from ..values import CHUNK, EPS, token_shift, value_mix

__all__ = ["LinearAttention", "taylor_features"]


def taylor_features(u: Tensor) -> Tensor:
    """(…, f) → (…, 1 + f + f²): φ with φ(q)·φ(k) = 1 + q·k/√f + (q·k)²/(2f)."""
    f = u.shape[-1]
    outer = (u.unsqueeze(-1) * u.unsqueeze(-2)).flatten(-2) / (2 ** 0.5 * f ** 0.5)
    return torch.cat([torch.ones_like(u[..., :1]), u / f ** 0.25, outer], dim=-1)


class LinearAttention(nn.Module):
    """Multi-head linear attention (identity or Taylor feature map) with PoM's forward contract for self-mixing.

    Args:
        dim: model width; heads: H; feature_dim: f, the query / key width per head; value_dim: dv (default dim).
        feature_map: "identity" or "taylor" (Based); causal: the default masking; bias: of the projections.
        token_shift: mix each token's key and value projections with the previous token's (learned per channel,
            initialised 0.5 / 0.5, like the value-carrying PoM's shift).
    """

    def __init__(self, dim: int, heads: int = 1, feature_dim: int = 16, value_dim: Optional[int] = None,
                 feature_map: str = "taylor", causal: bool = True, bias: bool = False, chunk_size: int = CHUNK,
                 token_shift: bool = False) -> None:
        super().__init__()
        value_dim = dim if value_dim is None else value_dim
        for name, v in (("dim", dim), ("heads", heads), ("feature_dim", feature_dim), ("value_dim", value_dim),
                        ("chunk_size", chunk_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if value_dim % heads:
            raise ValueError(f"value_dim = {value_dim} is not divisible by heads = {heads}")
        if feature_map not in ("identity", "taylor"):
            raise ValueError(f"feature_map must be 'identity' or 'taylor', got {feature_map!r}")
        self.dim, self.heads, self.feature_dim, self.value_dim = dim, heads, feature_dim, value_dim
        self.feature_map, self.causal, self.chunk_size = feature_map, causal, chunk_size
        self.token_shift = bool(token_shift)
        self.qk = nn.Linear(dim, 2 * heads * feature_dim, bias=bias)
        self.v = nn.Linear(dim, value_dim, bias=bias)
        self.out = nn.Linear(value_dim, dim, bias=bias)
        if feature_map == "identity":
            self.norm_weight = nn.Parameter(torch.empty(value_dim))
        if self.token_shift:  # over the key and value projections: (current, previous) × (H·f + dv) channels
            self.shift = nn.Parameter(torch.empty(2, heads * feature_dim + value_dim))
            self.shift.no_weight_decay = True
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Unit gains of the norm, 0.5 / 0.5 of the token shift (the projections reset themselves)."""
        with torch.no_grad():
            if self.feature_map == "identity":
                self.norm_weight.fill_(1.0)
            if self.token_shift:
                self.shift.fill_(0.5)

    @property
    def state_floats(self) -> int:
        """Floats of recurrent state per sequence."""
        f = self.feature_dim if self.feature_map == "identity" else 1 + self.feature_dim + self.feature_dim ** 2
        normaliser = f * self.heads if self.feature_map == "taylor" else 0
        shift = (self.heads * self.feature_dim + self.value_dim) if self.token_shift else 0  # the previous token
        return f * self.value_dim + normaliser + shift

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, heads={self.heads}, feature_dim={self.feature_dim}, value_dim={self.value_dim}, "
                f"feature_map={self.feature_map!r}, causal={self.causal}, token_shift={self.token_shift}")

    def forward(self, x: Tensor, context: Optional[Tensor] = None, *, mask: Optional[Tensor] = None,
                causal: Optional[bool] = None, **unused: Optional[Tensor]) -> Tensor:
        """x: (B, N, dim); mask: (B, N) key padding. Self-mixing only (``context`` must be None)."""
        if context is not None:
            raise ValueError("LinearAttention mixes a sequence with itself; context is not supported")
        if parallel.active() is not None:
            raise NotImplementedError("LinearAttention has no context-parallel form: use PoM, the value PoM or "
                                      "attention inside polymixer.context_parallel")
        if unused.get("cu_seqlens") is not None or unused.get("block_size") is not None:
            raise ValueError("LinearAttention supports full and causal self-mixing with key padding only")
        causal = self.causal if causal is None else causal
        B, N, _ = check_mix_inputs(x, None, self.dim, mask, causal, None, None)[:3]
        H, f = self.heads, self.feature_dim
        qk, v = self.qk(x), self.v(x)
        if self.token_shift:
            kv = token_shift(torch.cat([qk[..., H * f:], v], dim=-1), self.shift, mask)[0]
            qk, v = torch.cat([qk[..., :H * f], kv[..., :H * f]], dim=-1), kv[..., H * f:]
        qk = qk.view(B, N, 2, H, f).permute(2, 0, 3, 1, 4)  # (2, B, H, N, f)
        q, k = qk[0], qk[1]
        if self.feature_map == "taylor":
            q, k = taylor_features(q), taylor_features(k)
        v = v.reshape(B, N, H, -1).transpose(1, 2)
        w = mask.to(x.dtype) if mask is not None else x.new_ones(B, N)
        k = k * w[:, None, :, None]
        o = value_mix(q, k, v, w, causal=causal, chunk=self.chunk_size)[0]
        if self.feature_map == "taylor":
            den = value_mix(q, k, torch.ones_like(v[..., :1]), w, causal=causal, chunk=self.chunk_size)[0]
            o = o / (den + EPS)
        else:
            o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + EPS)
        o = o.transpose(1, 2).reshape(B, N, self.value_dim)
        if self.feature_map == "identity":
            o = o * self.norm_weight
        return self.out(o)
