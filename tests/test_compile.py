"""torch.compile(fullgraph=True): no graph break, and compiled == eager (forward and gradients)."""

from __future__ import annotations

import pytest
import torch

from polymixer import PoM, PolyMorpher


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("kw", [dict(), dict(causal=True)], ids=["full", "causal"])
def test_compiled_pom_equals_eager(kw):
    m = PoM(32, degree=3, sel_heads=4)
    with torch.no_grad():
        m.coeff.uniform_(-0.5, 0.5)
    cm = torch.compile(m, fullgraph=True)
    x = torch.randn(2, 96, 32, requires_grad=True)
    y_eager = m(x, **kw)
    g_eager = torch.autograd.grad(y_eager.square().sum(), [x, m.coeff, m.in_proj.weight])
    y = cm(x, **kw)
    g = torch.autograd.grad(y.square().sum(), [x, m.coeff, m.in_proj.weight])
    torch.testing.assert_close(y, y_eager, rtol=1e-4, atol=1e-5)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_compiled_modes_with_masks_rope_and_packing():
    m = PoM(16, rope="1d")
    cm = torch.compile(m, fullgraph=True, dynamic=False)
    x = torch.randn(1, 40, 16)
    km = torch.rand(1, 40) > 0.3
    cu = torch.tensor([0, 13, 40], dtype=torch.int32)
    for kw in (dict(causal=True, block_size=8, mask=km), dict(causal=True, cu_seqlens=cu)):
        torch.testing.assert_close(cm(x, **kw), m(x, **kw), rtol=1e-4, atol=1e-5)


def test_compiled_block_with_attention_equals_eager():
    b = PolyMorpher(32, "local_attention", heads=4, window=8)
    cb = torch.compile(b, fullgraph=True)
    x = torch.randn(2, 40, 32)
    torch.testing.assert_close(cb(x, causal=True), b(x, causal=True), rtol=1e-4, atol=1e-5)
