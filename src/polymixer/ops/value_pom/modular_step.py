"""The ``torch`` backend of the streaming value-carrying PoM step (see
:func:`polymixer.ops.value_pom.modular.value_pom_step`)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from torch import Tensor

from .modular import value_pom_step

__all__ = ["supports", "forward"]


def supports(call: Any) -> Optional[str]:
    """Every call."""
    return None


def forward(call: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return value_pom_step(*call.args, **call.kwargs)
