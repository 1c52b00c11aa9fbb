"""polymixer — the Polynomial Mixer (PoM), a linear-time drop-in replacement for self-attention.

    from polymixer import PoM, PolyMorpher, Attention, PoMState
"""

from . import functional
from .attention import Attention, AttentionState
from .blocks import MLP, PolyMorpher, build_mixer
from .mixer import PoM, PoMState

__version__ = "0.1.0"

__all__ = ["PoM", "PoMState", "PolyMorpher", "Attention", "AttentionState", "MLP", "build_mixer", "functional"]
