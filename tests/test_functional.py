"""The pure operations: prefix sums, Horner polynomials, rotary tables, and what they never allocate."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from polymixer import PoM
from polymixer import functional as Fn
from polymixer.ops.common import FUSED_BACKWARD, elementwise_backward
from polymixer.ops.features import chunked_cumsum


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 97, 2049, 5000])
def test_cumsum_matches_float64(n):
    x = torch.randn(3, n, 5)
    ref = x.double().cumsum(1)
    torch.testing.assert_close(Fn.cumsum(x).double(), ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(chunked_cumsum(x, reverse=True).double(), x.double().flip(1).cumsum(1).flip(1),
                               rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(Fn.cumsum(x[..., 0]).double(), ref[..., 0], rtol=1e-5, atol=1e-4)


def test_cumsum_long_is_more_accurate_than_sequential():
    x = torch.rand(1, 200_000, 4)
    ref = x.double().cumsum(1)
    err_chunked = (Fn.cumsum(x).double() - ref).abs().max()
    assert err_chunked / ref.abs().max() < 1e-6


@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_poly_features_literal(k):
    z = torch.randn(2, 9, 7, dtype=torch.float64) * 4
    coeff = torch.randn(7, k, dtype=torch.float64)
    h = torch.nn.functional.leaky_relu(z, 0.01).clamp(-0.1, 6.0)
    literal = sum(coeff[:, p] * h ** (p + 1) for p in range(k))
    torch.testing.assert_close(Fn.poly_features(z, coeff), literal)
    # a strided view (a slice of the fused projection) gives the same
    big = torch.cat([z, torch.randn_like(z)], -1)
    torch.testing.assert_close(Fn.poly_features(big[..., :7], coeff), literal)


def test_poly_features_bf16_computes_in_fp32():
    z = torch.randn(2, 5, 8, dtype=torch.bfloat16)
    out = Fn.poly_features(z, torch.randn(8, 2, dtype=torch.bfloat16))
    assert out.dtype == torch.float32


def test_rotate_inverse_and_relative():
    x = torch.randn(4, 10, 16, dtype=torch.float64)
    p = torch.randint(0, 10**6, (10,))
    c, s = Fn.rope_angles(p, 16, dtype=torch.float64)
    torch.testing.assert_close(Fn.rotate(Fn.rotate(x, c, s), c, s, inverse=True), x)
    # rotation angles stay exact at long range in fp32 tables (reduced mod 2π in fp64 first)
    c32, s32 = Fn.rope_angles(p, 16)
    torch.testing.assert_close(c32.double(), c, atol=1e-6, rtol=0)
    torch.testing.assert_close(s32.double(), s, atol=1e-6, rtol=0)


class _Largest(TorchDispatchMode):
    """Record the largest tensor any ATen op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0
        self.shape = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor) and t.numel() > self.largest:
                self.largest, self.shape = t.numel(), tuple(t.shape)
        return out


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(causal=True, block_size=64),
                                dict(mask="key", causal=True), dict(rope="1d", causal=True),
                                dict(cu_seqlens=True, causal=True)],
                         ids=["full", "causal", "block", "key-causal", "rope-causal", "packed"])
def test_no_power_tensor_and_no_quadratic_tensor(kw, fused):
    """Nothing of size (B, N, D, k) — nor N×N — is ever produced, forward or backward."""
    kw = dict(kw)
    rope = kw.pop("rope", None)
    B, N, d, k = 1, 1024, 16, 4  # N² = 1M > B·N·(D+Ds) = 64k; B·N·D·k = 128k
    m = PoM(d, degree=k, rope=rope)
    x = torch.randn(B, N, d, requires_grad=True)
    if kw.get("mask") == "key":
        kw["mask"] = torch.rand(B, N) > 0.2
    if kw.get("cu_seqlens"):
        kw["cu_seqlens"] = torch.tensor([0, 100, 700, N], dtype=torch.int32)
    with _Largest() as rec:
        y = m(x, **kw)
        y.sum().backward()
    assert rec.largest <= B * N * 2 * m.poly_dim, rec.shape


@pytest.mark.parametrize("fused_path", [True, False])
def test_saved_tensors_per_layer(fused_path):
    """Training saves a few (B, N, D) tensors per layer, not one per operation."""
    B, N, d = 2, 512, 32
    m = PoM(d)  # D = 64
    x = torch.randn(B, N, d, requires_grad=True)
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with Fn.fused_kernels(fused_path), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(x, causal=True).sum()
    unit = B * N * m.poly_dim * 4
    saved = sum(v for v in storages.values() if v >= unit // 4)
    assert saved <= 4.5 * unit, saved / unit


@pytest.mark.parametrize("table,name", [("ACTIVATIONS", "leaky_clamp"), ("GATES", "hardsigmoid")])
def test_fused_elementwise_backward_matches_autograd(table, name):
    # the fused ATen kernels of the custom backwards agree with autograd away from the kinks
    fn, dfn = getattr(Fn, table)[name]
    u = (torch.randn(4, 7, 33, dtype=torch.float64) * 8).requires_grad_()
    g = torch.randn_like(u)
    (ref,) = torch.autograd.grad(fn(u), u, g)
    assert fn in FUSED_BACKWARD
    torch.testing.assert_close(elementwise_backward(fn, dfn, u.detach(), g), ref)
    torch.testing.assert_close(elementwise_backward(fn, dfn, u.detach().float(), g.float()), ref.float())
