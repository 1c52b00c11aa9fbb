"""torch.compile(fullgraph=True): no graph break, and compiled == eager (forward and gradients)."""

from __future__ import annotations

import pytest
import torch

from polymixer import GatedValuePoM, PoM, PolyMorpher, ValuePoM


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


@pytest.mark.parametrize("cls", [PoM, ValuePoM, GatedValuePoM])
def test_every_layers_forward_and_stream_compile_in_one_graph(cls):
    """The layer builds its weights object and calls its op — to mix, and with a state to stream — inside one graph
    (torch.compile(fullgraph=True)), equal to eager."""
    torch.manual_seed(0)
    m = cls(8, **({} if cls is PoM else dict(value_dim=8, heads=2)))
    x = torch.randn(2, 12, 8)
    forward = torch.compile(lambda x: m(x, causal=True), backend="aot_eager", fullgraph=True)
    step = torch.compile(lambda x, s: m.step(x, s), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(forward(x), m(x, causal=True))
    (y, state), (want, want_state) = step(x[:, :5], m.init_state(2)), m.step(x[:, :5], m.init_state(2))
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(state.sum, want_state.sum)


def test_compiled_block_with_attention_equals_eager():
    b = PolyMorpher(32, "local_attention", heads=4, window=8)
    cb = torch.compile(b, fullgraph=True)
    x = torch.randn(2, 40, 32)
    torch.testing.assert_close(cb(x, causal=True), b(x, causal=True), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("value", [False, True], ids=["pom", "value_pom"])
def test_compiled_torch_form_gradients_equal_eager(value, device):
    """The torch form (its autograd.Functions: features, gate) under torch.compile(fullgraph=True) on the test device
    (``POLYMIXER_TEST_DEVICE=cuda``: the GPU): the output and the gradient of the input and of every parameter equal
    eager. With torch 2.11 (on an H200, and on a CPU) every gradient upstream of the output projection came out zero
    while the forwards returned tensors they had changed in place (see the test below)."""
    from polymixer import backend

    torch.manual_seed(0)
    m = (ValuePoM(8, degree=3, expand=2, bias=True, heads=2) if value else PoM(8, degree=3, expand=2, bias=True))
    m = m.to(device)
    with torch.no_grad():
        m.coeff.uniform_(-1.0, 1.0)
        m.gate_bias.normal_()
    x = torch.randn(2, 21, 8, device=device)

    def f(x):
        with backend("torch"):
            return m(x, causal=True)

    def grads(fn):
        m.zero_grad()
        xx = x.clone().requires_grad_()
        y = fn(xx)
        y.square().sum().backward()
        return [y.detach(), xx.grad] + [p.grad.clone() for p in m.parameters()]

    want = grads(f)
    for be in ("eager", "aot_eager"):
        torch._dynamo.reset()
        got = grads(torch.compile(f, fullgraph=True, backend=be))
        for a, b in zip(got, want):
            assert b.abs().max() > 0
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_forwards_return_untouched_tensors_while_compiling(monkeypatch):
    """While torch.compile traces them, the autograd.Functions' forwards return fresh tensors that nothing changed in
    place, and ``cast_output`` returns its tensor itself rather than an alias: torch 2.11's dynamo silently zeroed
    every gradient of a custom backward whose forward returned ``acc.mul_(h)`` (Horner's last step) or
    ``out.to(out.dtype)`` (the gate), in eager-backend, aot_eager and inductor alike (seen on an H200, then
    reproduced with torch 2.11 on a CPU; torch 2.13 traces both correctly, so on this machine only the pattern can be
    checked)."""
    from polymixer.ops import features
    from polymixer.ops.common import cast_output

    z, coeff = torch.randn(2, 5, 4), torch.randn(4, 3)
    eager = features.poly_features(z, coeff, "gelu")
    monkeypatch.setattr(features, "is_compiling", lambda: True)
    traced = features.poly_features(z, coeff, "gelu")
    assert traced._version == 0
    torch.testing.assert_close(traced, eager)
    out = features.gate_mix(torch.randn(2, 5, 4), torch.randn(4), torch.randn(2, 5, 4))
    assert out._version == 0
    t = torch.randn(3)
    assert cast_output(t, torch.float32) is t and cast_output(t, torch.float64).dtype == torch.float64
