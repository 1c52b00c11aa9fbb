"""The ``triton_gemm`` backend of PoM: the input projection inside the mixing kernels, so that z is never written.

The kernels of :mod:`polymixer.ops.pom.triton_kernels` with ``FUSED``: every tile of z_h / z_s is a matrix product
of a tile of x with rows of W_in (``tl.dot``, fp32 accumulation) computed where the mixing needs it, and the
activation, polynomial, running sums and gate follow in registers. The forward writes only g (and the chunk carries
or the end table); W_o stays a cuBLAS product. The backward recomputes z the same way and writes dz, from which
cuBLAS forms dL/dx and dL/dW_in.

Not in the automatic choice until a GPU measures it faster than the torch form and the unfused route for a kind of
call (an entry of :mod:`polymixer.ops.measured` on the kernels installed now): the H200 measured it 1.3–2.7× slower
than the unfused route everywhere it was timed, though the roofline model
(:func:`polymixer.experiments.bench.roofline.predicted_win`) had predicted it faster at narrow widths.
``backend("triton_gemm")`` forces it, ``backend("triton")`` forces the unfused route.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..call import Call
from ..common import operand_dtype
from ..triton_common import first_use
from . import triton_kernels as tk

__all__ = ["supports", "forward", "self_check"]


def supports(call: Call) -> Optional[str]:
    """What the unfused kernels take where a fused tile fits the call's kernels. Whether the automatic choice wants
    the route at all is the dispatcher's speed rule's to say, after this (:mod:`polymixer.ops.measured`)."""
    why = tk.supports(call, fused=True)
    if why is None and tk.needs_check(call.x.device):
        return self_check(call.x.device, operand_dtype(call.x))
    return why


def _check(device: torch.device, dtype: torch.dtype) -> None:
    tk.run_check(device, dtype, "triton_gemm")


def self_check(device: torch.device, dtype: torch.dtype = torch.float32) -> Optional[str]:
    """The first-use check of the fused route on ``device`` (as :func:`polymixer.ops.pom.triton_kernels.self_check`)."""
    return first_use("pom_gemm", device, dtype, _check)


def forward(call: Call) -> Tensor:
    """The whole PoM of ``call``: the input projection and the mixing in the kernels (one custom op), W_o (torch)."""
    dtype = operand_dtype(call.x)
    x, w = call.x.to(dtype).contiguous(), call.weights
    g = tk.pom_gemm_op(x, w.in_weight.to(dtype).contiguous(), w.coeff, w.gate_bias, *tk.mix_args(call, call.N))[0]
    return F.linear(g, w.out_weight, w.out_bias)
