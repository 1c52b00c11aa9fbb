"""One op, several backends: the dispatcher's automatic choice, the strict explicit choice, what it says about
both, and the public names kept where users import them."""

from __future__ import annotations

import logging

import pytest
import torch

import polymixer
from polymixer import PoM, functional
from polymixer.ops import BACKENDS, backend, backend_for, current_backend, disabled_backends


def _args(m: PoM, x: torch.Tensor):
    return (x, None, m.in_proj.weight, m.gate_bias, m.coeff, m.out_proj.weight)


def test_the_automatic_choice_and_its_reasons():
    m = PoM(8)
    x = torch.randn(2, 5, 8)
    plain = backend_for("pom", *_args(m, x), causal=True)
    assert plain["backend"] == "cpu" and not plain["explicit"] and "CUDA tensors only" in plain["passed_over"]["triton"]
    padded = backend_for("pom", *_args(m, x), causal=True, mask=torch.ones(2, 5, dtype=torch.bool))
    assert padded["backend"] == "torch" and padded["passed_over"]["cpu"] == "key padding is not fused"
    with disabled_backends("cpu"):
        assert backend_for("pom", *_args(m, x))["passed_over"]["cpu"] == "switched off"
    with functional.fused_kernels(False):  # the older switch does the same
        assert backend_for("pom", *_args(m, x))["backend"] == "torch"
    assert polymixer.backend_for is backend_for
    assert set(BACKENDS) == {"reference", "torch", "cpu", "triton", "triton_gemm"}


def test_an_explicit_choice_is_strict_and_says_why():
    m = PoM(8)
    x = torch.randn(2, 5, 8)
    with backend("cpu"):
        assert current_backend() == "cpu"
        m(x, causal=True)
        with pytest.raises(NotImplementedError, match="backend 'cpu' cannot take this pom call: block-causal "
                                                      "masking is not fused"):
            m(x, causal=True, block_size=2)
        with backend("torch"):  # the innermost block wins
            m(x, causal=True, block_size=2)
    assert current_backend() is None
    v = PoM(8, value_dim=8)
    with backend("cpu"), pytest.raises(NotImplementedError, match="backend 'cpu' has no value_pom"):
        v(x)
    with pytest.raises(ValueError, match="unknown backend 'cuda'; the backends are reference, torch, cpu, triton"):
        with backend("cuda"):
            pass


@pytest.mark.parametrize("op", ["pom", "value_pom"])
def test_every_backend_of_an_op_agrees_with_the_reference_in_float64(op):
    kw = dict(value_dim=8, heads=2) if op == "value_pom" else {}
    m = PoM(8, degree=3, bias=True, **kw).double()
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    for mode in (dict(causal=True), {}, dict(causal=True, block_size=4)):
        with backend("reference"):
            want = m(x, **mode)
        for name in ("torch", "cpu") if op == "pom" else ("torch",):
            if name == "cpu" and "block_size" in mode:
                continue
            with backend(name):
                torch.testing.assert_close(m(x, **mode), want, rtol=1e-10, atol=1e-10)


def test_the_choice_is_logged_at_debug_level(caplog):
    m = PoM(8)
    with caplog.at_level(logging.DEBUG, logger="polymixer.ops"):
        m(torch.randn(1, 4, 8), mask=torch.ones(1, 4, dtype=torch.bool))
    assert any("pom on torch" in r.message and "cpu passed over: key padding is not fused" in r.message
               for r in caplog.records)


def test_the_public_names_stay_where_users_import_them():
    from polymixer import reference, values

    for name in ("pom", "pom_step", "poly_features", "cumsum", "aggregate", "gate_mix", "rope_angles", "rotate",
                 "check_cu_seqlens", "documents_cu_seqlens", "fused_kernels", "ACTIVATIONS", "GATES"):
        assert hasattr(functional, name), name
    for name in ("value_pom", "value_pom_step", "value_mix", "packed_causal_mix", "token_shift", "pad_packed"):
        assert hasattr(values, name), name
    for name in ("visibility", "reference_pom", "reference_value_pom", "reference_attention", "shift_validity"):
        assert hasattr(reference, name), name
