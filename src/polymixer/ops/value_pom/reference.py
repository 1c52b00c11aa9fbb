"""The ``reference`` backend of the value-carrying PoM: the float64 oracle
(:func:`polymixer.ops.reference.reference_value_pom`) with the visibility matrix and token-shift validity of the
call's mode. O(M·N): for tests and checks, never chosen automatically."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from ..common import batch_packed, check_mix_inputs, packed_local_positions
from ..reference import reference_value_pom, shift_validity, visibility

__all__ = ["supports", "forward"]

_ARGS = ("x", "context", "in_weight", "gate_bias", "coeff", "coeff_q", "shift_weight", "norm_weight", "out_weight",
         "out_bias")


def supports(call: object) -> Optional[str]:
    """Every call."""
    return None


def forward(call) -> Tensor:  # call: polymixer.ops.value_pom.ValueCall
    a = dict(zip(_ARGS, call.args))
    a.setdefault("out_bias", None)
    kw = dict(call.kwargs)
    for name in _ARGS:
        if name in kw:
            a[name] = kw.pop(name)
    cu = kw.pop("cu_seqlens", None)
    x, context, squeeze = batch_packed(a["x"], a["context"], cu)
    d = a["out_weight"].shape[0]
    B, M, N, key_mask, general, cu_q, cu_k = check_mix_inputs(x, context, d, kw.pop("mask", None),
                                                             kw.get("causal", False), kw.get("block_size"), cu)
    vis = visibility(B, M, N, causal=kw.pop("causal", False), block_size=kw.pop("block_size", None),
                     key_mask=key_mask, mask=general, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k).to(x.device)
    shift = a["shift_weight"]
    has_prev = shift_validity(B, N, key_mask, cu_k, lags=max(shift.shape[0] - 1, 1) if shift is not None else 1)
    has_prev = has_prev.to(x.device)
    kw.pop("chunk", None)
    rope = kw.get("rope")
    if rope is not None:
        two_d = rope == "2d"
        pos, cpos = kw.get("positions"), kw.get("context_positions")
        if cpos is None and context is None:
            cpos = pos
        if cpos is None:
            cpos = packed_local_positions(cu_k, N, x.device, two_d, "context_positions")
        if pos is None:
            pos = packed_local_positions(cu_q if cu_q is not None else cu_k, M, x.device, two_d, "positions")
        kw["positions"], kw["context_positions"] = pos, cpos
    y = reference_value_pom(x, context, a["in_weight"], a["gate_bias"], a["coeff"], a["coeff_q"], a["shift_weight"],
                            a["norm_weight"], a["out_weight"], a["out_bias"], vis, has_prev=has_prev, **kw)
    y = y.to(x.dtype)
    return y.squeeze(0) if squeeze else y
