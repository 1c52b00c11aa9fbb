"""The token mixers, one class per mixer: PoM (and its streaming PoMState), the value-carrying ValuePoM and
GatedValuePoM, Attention (global, KV cache) and LocalAttention (sliding window), the linear-attention baselines, and
the positions they share."""

from .attention import Attention, AttentionState, LocalAttention
from .pom import PoM, PoMState
from .value_pom import GatedValuePoM, ValuePoM

__all__ = ["PoM", "ValuePoM", "GatedValuePoM", "PoMState", "Attention", "LocalAttention", "AttentionState"]
