"""The value-carrying PoM as an op with several backends: :func:`value_pom` (parallel, every mode) and
:func:`value_pom_step` (streaming). See :mod:`polymixer.ops.value_pom.modular` for the math."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from torch import Tensor

from .. import dispatch, parallel

__all__ = ["ValueCall", "value_pom", "value_pom_step", "backend_for"]


@dataclass
class ValueCall:
    """A value-PoM call as its backends receive it: the arguments of :func:`value_pom` and what they ask for."""

    args: Tuple[Any, ...]
    kwargs: Dict[str, Any] = field(default_factory=dict)

    @property
    def x(self) -> Tensor:
        return self.args[0]

    @property
    def context(self) -> Optional[Tensor]:
        return self.args[1]

    @property
    def self_mix(self) -> bool:
        return self.context is None

    def get(self, name: str, default: Any = None) -> Any:
        return self.kwargs.get(name, default)

    def describe(self) -> str:
        mode = "block-causal" if self.get("block_size") else "causal" if self.get("causal") else "full"
        parts = [mode, "self-mixing" if self.self_mix else "cross-mixing"]
        mask = self.get("mask")
        if mask is not None:
            parts.append("key padding" if mask.dim() == 2 else "(B, M, N) mask")
        if self.get("cu_seqlens") is not None:
            parts.append("packed")
        if self.get("rope"):
            parts.append(f"{self.get('rope')} rotary")
        parts.append(f"{self.x.dtype} on {self.x.device.type}")
        return ", ".join(parts)


def value_pom(*args: Any, **kwargs: Any) -> Tensor:
    """The value-carrying PoM (arguments of :func:`polymixer.ops.value_pom.modular.value_pom`) on the backend the
    dispatcher picks."""
    cp = parallel.active()
    if cp is not None:  # this rank's slice of every sequence (polymixer.context_parallel)
        from .context_parallel import forward as split_forward

        return split_forward(args, kwargs, cp)
    call = ValueCall(args, kwargs)
    return dispatch.choose("value_pom", call).forward(call)


def value_pom_step(*args: Any, **kwargs: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Streaming value-carrying PoM (arguments of :func:`polymixer.ops.value_pom.modular.value_pom_step`)."""
    cp = parallel.active()
    if cp is not None:  # a context-parallel prefill: the state after each rank's slice (the last rank: all)
        from .context_parallel import step as split_step

        return split_step(args, kwargs, cp)
    call = ValueCall(args, kwargs)
    return dispatch.choose("value_pom_step", call).forward(call)


def backend_for(*args: Any, **kwargs: Any) -> Dict[str, Any]:
    """Which backend :func:`value_pom` would run these arguments on, and why the others were passed over."""
    return dispatch.backend_for("value_pom", ValueCall(args, kwargs))


# the backends of value_pom and value_pom_step: the kernels imported with the package wherever they could run (a GPU
# or the interpreter), so that a strict backend("triton") works inside torch.compile from the first call (dynamo
# cannot trace an import), and taken automatically only where a GPU measured them faster (polymixer.ops.measured)
from .. import measured  # noqa: E402
from ..common import triton_possible, triton_precheck  # noqa: E402
from . import modular, modular_step, reference  # noqa: E402

dispatch.register("value_pom", "reference", reference)
dispatch.register("value_pom", "torch", modular)
dispatch.register("value_pom", "triton", "polymixer.ops.value_pom.triton_kernels", precheck=triton_precheck,
                  eager=triton_possible(), speed=measured.rule("value_pom", "triton"))
dispatch.register("value_pom_step", "torch", modular_step)
