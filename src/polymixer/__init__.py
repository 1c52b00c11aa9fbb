"""polymixer — the Polynomial Mixer (PoM), a linear-time drop-in replacement for self-attention.

    from polymixer import PoM, PolyMorpher, Attention, PoMState
    from polymixer import ValuePoM, GatedValuePoM, LocalAttention  # one class per mixer, built one way
    with polymixer.backend("triton"): ...     # choose an op backend (reference / torch / cpu / triton), strictly
    from polymixer import pomify        # attention → PoM / hybrid in a trained model (polymixer or transformers)
    with polymixer.context_parallel(): ...    # each rank holds a slice of every sequence (torch.distributed)
"""

from . import functional, ops
from .layers.attention import Attention, AttentionState, LocalAttention
from .blocks import MLP, PolyMorpher, build_mixer
from .layers.pom import PoM, PoMState
from .layers.value_pom import GatedValuePoM, ValuePoM
from .ops import backend, backend_for
from .ops.parallel import context_parallel
from .pomify import pomify

__version__ = "0.1.0"


def _register_with_transformers() -> None:
    """Register polymixer's language models with transformers' Auto classes whenever transformers gets imported
    (now or later), without importing it here: ``import polymixer`` stays fast and transformers stays optional."""
    from .import_hooks import when_imported

    def hook(_module: object) -> None:
        try:
            from . import hf  # noqa: F401  (registers on import)
        except Exception as e:  # never break the user's `import transformers`
            import warnings

            warnings.warn(f"polymixer could not register with transformers: {e}", stacklevel=2)

    when_imported("transformers", hook)


_register_with_transformers()

__all__ = ["PoM", "ValuePoM", "GatedValuePoM", "PoMState", "PolyMorpher", "Attention", "LocalAttention",
           "AttentionState", "MLP", "build_mixer", "functional", "ops",
           "backend", "backend_for", "pomify", "context_parallel"]
