"""torch.autograd.gradcheck in float64 on small shapes, for every mode and every custom backward."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

from polymixer import functional as Fn

B, N, d, D = 2, 7, 3, 6


def _params(Ds=D, k=3, bias=True):
    t = lambda *s: torch.randn(*s, dtype=torch.float64, requires_grad=True)  # noqa: E731
    coeff = (torch.rand(D, k, dtype=torch.float64) * 2 - 1).requires_grad_()
    return t(D + Ds, d), t(Ds), coeff, t(d, D), (t(d) if bias else None)


MODES = {
    "full": dict(),
    "causal": dict(causal=True),
    "block": dict(causal=True, block_size=3),
    "key-padding": dict(mask=torch.tensor([[1, 1, 0, 1, 0, 1, 1], [0, 1, 1, 1, 1, 0, 1]], dtype=torch.bool)),
    "key-padding-causal": dict(causal=True, mask=torch.tensor([[1, 1, 0, 1, 0, 1, 1], [0, 1, 1, 1, 1, 0, 1]],
                                                                dtype=torch.bool)),
    "general": dict(mask=torch.rand(B, N, N, generator=torch.Generator().manual_seed(1)) > 0.4),
    "rope-causal": dict(causal=True, rope="1d"),
    "sum-causal": dict(causal=True, reduction="sum"),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("Ds", [D, 2], ids=["gate-per-channel", "gate-per-head"])
def test_pom_gradcheck(mode, Ds, fused):
    kw = dict(MODES[mode])
    x = torch.randn(B, N, d, dtype=torch.float64, requires_grad=True)
    params = _params(Ds)

    def f(x, *p):
        return Fn.pom(x, Fn.PomWeights(*p), **kw)

    assert gradcheck(f, (x, *params), eps=1e-6, atol=1e-6)


def test_pom_gradcheck_rope_2d(fused):
    D4 = 8
    x = torch.randn(B, 6, d, dtype=torch.float64, requires_grad=True)
    p = [torch.randn(2 * D4, d, dtype=torch.float64, requires_grad=True),
         torch.randn(D4, dtype=torch.float64, requires_grad=True),
         torch.rand(D4, 2, dtype=torch.float64).mul(2).sub(1).requires_grad_(),
         torch.randn(d, D4, dtype=torch.float64, requires_grad=True)]
    pos = torch.stack([torch.arange(6) // 3, torch.arange(6) % 3], -1)
    for kw in (dict(), dict(causal=True, block_size=3)):
        assert gradcheck(lambda x, *q: Fn.pom(x, Fn.PomWeights(*q), rope="2d", positions=pos, **kw), (x, *p),
                         eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(causal=True, block_size=2)],
                         ids=["full", "causal", "block"])
def test_cross_gradcheck(kw, fused):
    x = torch.randn(B, 5, d, dtype=torch.float64, requires_grad=True)
    ctx = torch.randn(B, N, d, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, c, *p: Fn.pom(x, Fn.PomWeights(*p), c, **kw), (x, ctx, *_params(2)), eps=1e-6,
                     atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_gradcheck(causal, fused):
    cu = torch.tensor([0, 2, 7, 10], dtype=torch.int32)
    x = torch.randn(1, 10, d, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, *p: Fn.pom(x, Fn.PomWeights(*p), causal=causal, cu_seqlens=cu), (x, *_params()),
                     eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_step_gradcheck(causal):
    x = torch.randn(B, 4, d, dtype=torch.float64, requires_grad=True)
    s0 = torch.randn(B, D, dtype=torch.float64, requires_grad=True)
    c0 = torch.tensor([3.0, 5.0], dtype=torch.float64)
    off = torch.tensor([3, 5])

    def f(x, s0, *p):
        y, state = Fn.pom(x, Fn.PomWeights(*p), state=Fn.PoMState(s0, c0, off), causal=causal, rope="1d")
        return y, state.sum

    assert gradcheck(f, (x, s0, *_params()), eps=1e-6, atol=1e-6)


def test_building_blocks_gradcheck():
    z = torch.randn(2, 70, 5, dtype=torch.float64, requires_grad=True)
    coeff = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    for act in ("leaky_clamp", "gelu", "silu", "tanh", torch.sin):
        assert gradcheck(lambda z, c: Fn.poly_features(z, c, act), (z, coeff), eps=1e-6, atol=1e-6)
    assert gradcheck(Fn.cumsum, (z,), eps=1e-6, atol=1e-6)  # 70 tokens: the chunked path with padding
    zs = torch.randn(2, 70, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    h = torch.randn(2, 1, 5, dtype=torch.float64, requires_grad=True)
    for gate in ("hardsigmoid", "sigmoid", "identity"):
        assert gradcheck(lambda zs, b, h: Fn.gate_mix(zs, b, h, gate), (zs, b, h), eps=1e-6, atol=1e-6)
    hh = torch.randn(2, 70, 10, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda zs, b, h: Fn.gate_mix(zs, b, h), (zs, b, hh), eps=1e-6, atol=1e-6)
