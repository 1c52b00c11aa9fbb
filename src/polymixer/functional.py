"""The Polynomial Mixer as pure functions on tensors — the public names of :mod:`polymixer.ops`, kept here.

* :func:`activation` / :func:`gate_fn` — elementwise non-linearities by name;
* :func:`poly_features` — ``Σ_p α_p ⊙ act(z)^p`` by Horner's scheme (never a ``(…, D, k)`` power tensor),
  with a custom backward that saves only its input;
* :func:`cumsum` — an inclusive prefix sum along the token axis computed chunk-wise (fp32 accumulation);
* :func:`aggregate` — H for every masking mode (full, causal, block-causal, key padding, general mask, packed
  ``cu_seqlens``, cross), always O(N·D) except for an explicit ``(B, M, N)`` mask;
* :func:`gate_mix` — the selection ``gate(z_s + b) ⊙ H`` with one gate scalar per head;
* :func:`rope_angles` / :func:`rotate` — rotary positions (1-D and 2-D);
* :func:`pom` — the whole operator, on the backend the dispatcher picks (:mod:`polymixer.ops.dispatch`;
  ``with polymixer.backend("torch"):`` chooses one): ``pom(x, PomWeights(...))`` (a layer's ``PoM.weights``), and
  with ``state=`` a :class:`PoMState` the next chunk of a stream, returning ``(y, state)``.

Shapes: ``B`` batch, ``N`` context tokens, ``M`` query tokens, ``d`` model width, ``D = expand·d`` polynomial width,
``Ds`` gate width (``D`` when ``sel_heads == 1``, else ``sel_heads``), ``k`` degree.
"""

from __future__ import annotations

from typing import ContextManager

from .ops.common import (
    ACTIVATIONS,
    GATES,
    ActivationLike,
    CuSeqlens,
    activation,
    batch_packed,
    check_cu_seqlens,
    check_mix_inputs,
    documents_cu_seqlens,
    gate_fn,
    rope_angles,
    rotate,
)
from .ops.dispatch import disabled_backends
from .ops.features import aggregate, cumsum, gate_mix, poly_features
from .ops.call import PoMState
from .ops.pom import PomWeights, pom

__all__ = ["ACTIVATIONS", "GATES", "ActivationLike", "CuSeqlens", "activation", "gate_fn", "poly_features",
           "cumsum", "aggregate", "gate_mix", "rope_angles", "rotate", "pom", "PomWeights", "PoMState",
           "check_cu_seqlens", "fused_kernels", "check_mix_inputs", "batch_packed", "documents_cu_seqlens"]


def fused_kernels(enabled: bool) -> ContextManager[None]:
    """``with fused_kernels(False):`` leaves the fused CPU path out of the automatic backend choice (the modular
    form runs instead), e.g. to compare both on the same inputs; ``True`` changes nothing. Equivalent to
    ``polymixer.ops.disabled_backends("cpu")``."""
    return disabled_backends(*(() if enabled else ("cpu",)))
