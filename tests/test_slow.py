"""Heavier checks, skipped by default: `python -m pytest -m slow`."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

from polymixer import PoM
from polymixer import functional as Fn

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_across_fused_tiles(causal):
    """gradcheck at N = 1100: three tiles of the fused path, with running sums carried across tiles."""
    d, D = 2, 4
    x = torch.randn(1, 1100, d, dtype=torch.float64, requires_grad=True)
    p = [torch.randn(2 * D, d, dtype=torch.float64, requires_grad=True),
         torch.randn(D, dtype=torch.float64, requires_grad=True),
         torch.rand(D, 2, dtype=torch.float64).requires_grad_(),
         torch.randn(d, D, dtype=torch.float64, requires_grad=True)]
    assert gradcheck(lambda x, *q: Fn.pom(x, Fn.PomWeights(*q), causal=causal), (x, *p), eps=1e-6, atol=1e-6)


def test_streaming_65k_tokens_fp32():
    m = PoM(64)
    with torch.no_grad():
        m.coeff.uniform_(-0.5, 0.5)
        x = torch.randn(1, 65536, 64)
        full = m(x, causal=True)
        state = m.init_state(1)
        outs = []
        for chunk in x[:, :65000].split(4096, dim=1):
            y, state = m.step(chunk, state)
            outs.append(y)
        for t in range(65000, 65536):
            y, state = m.step(x[:, t:t + 1], state)
            outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-4, atol=1e-5)


def test_compiled_training_at_benchmark_shape():
    m = PoM(512)
    cm = torch.compile(m, fullgraph=True)
    x = torch.randn(2, 4096, 512, requires_grad=True)
    y = cm(x, causal=True)
    g = torch.autograd.grad(y.square().mean(), x)[0]
    y2 = m(x, causal=True)
    g2 = torch.autograd.grad(y2.square().mean(), x)[0]
    torch.testing.assert_close(y, y2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(g, g2, rtol=1e-3, atol=1e-7)
