"""The token mixers, one class per mixer: PoM (and its streaming PoMState), Attention (global, sliding-window, KV
cache), the linear-attention baselines, and the positions they share."""

from .attention import Attention, AttentionState
from .pom import PoM, PoMState

__all__ = ["PoM", "PoMState", "Attention", "AttentionState"]
