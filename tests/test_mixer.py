"""PoM in every masking mode against the float64 oracle that builds the explicit visibility matrix."""

from __future__ import annotations

import pytest
import torch

from polymixer import PoM
from polymixer.reference import visibility

from conftest import assert_close, oracle, random_pom

B, N, D_MODEL = 2, 37, 8


def _modes():
    km = torch.rand(B, N) > 0.3
    return {
        "full": dict(),
        "causal": dict(causal=True),
        "block-causal": dict(causal=True, block_size=5),
        "block-causal-divides": dict(causal=True, block_size=N),
        "block-1-is-causal": dict(causal=True, block_size=1),
        "key-padding": dict(mask=km),
        "key-padding-causal": dict(mask=km, causal=True),
        "key-padding-block": dict(mask=km, causal=True, block_size=4),
        "general-mask": dict(mask=torch.rand(B, N, N) > 0.5),
        "general-mask-causal": dict(mask=torch.rand(B, N, N) > 0.3, causal=True),
    }


MODES = _modes()


def _vis(kw, M=N, K=N, **extra):
    mask = kw.get("mask")
    return visibility(
        B, M, K, causal=kw.get("causal", False), block_size=kw.get("block_size"),
        key_mask=mask if mask is not None and mask.dim() == 2 else None,
        mask=mask if mask is not None and mask.dim() == 3 else None, **extra,
    )


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("sel_heads", [1, 4])
def test_modes_match_reference(mode, sel_heads, fused):
    m = random_pom(D_MODEL, sel_heads=sel_heads)
    x = torch.randn(B, N, D_MODEL, dtype=torch.float64)
    kw = MODES[mode]
    assert_close(m(x, **kw), oracle(m, x, _vis(kw)))


@pytest.mark.parametrize("mode", ["full", "causal", "block-causal", "key-padding-causal", "general-mask"])
def test_sum_reduction_matches_reference(mode, fused):
    m = random_pom(D_MODEL, reduction="sum")
    x = torch.randn(B, N, D_MODEL, dtype=torch.float64)
    kw = MODES[mode]
    assert_close(m(x, **kw), oracle(m, x, _vis(kw)))


@pytest.mark.parametrize("gate", ["hardsigmoid", "sigmoid", "identity"])
@pytest.mark.parametrize("activation", ["leaky_clamp", "relu", "gelu", "silu", "tanh", "identity"])
@pytest.mark.parametrize("causal", [False, True])
def test_gates_and_activations(gate, activation, causal, fused):
    m = random_pom(D_MODEL, gate=gate, activation=activation, degree=2)
    x = 3 * torch.randn(B, N, D_MODEL, dtype=torch.float64)
    assert_close(m(x, causal=causal), oracle(m, x, _vis(dict(causal=causal))))


def test_callable_activation_and_gate(fused):
    m = random_pom(D_MODEL, activation=lambda t: torch.sin(t), gate=lambda u: torch.sigmoid(2 * u))
    x = torch.randn(B, N, D_MODEL, dtype=torch.float64, requires_grad=True)
    vis = _vis(dict(causal=True))
    y = m(x, causal=True)
    from polymixer.reference import reference_pom
    ref = reference_pom(x, m.weights, vis=vis, activation=m.activation, gate=m.gate)
    assert_close(y, ref)
    g1 = torch.autograd.grad(y.sum(), x)[0]
    g2 = torch.autograd.grad(ref.sum(), x)[0]
    assert_close(g1, g2)


@pytest.mark.parametrize("degree", [1, 2, 4, 5])
def test_degrees(degree, fused):
    m = random_pom(D_MODEL, degree=degree)
    x = torch.randn(B, N, D_MODEL, dtype=torch.float64)
    for kw in (dict(), dict(causal=True)):
        assert_close(m(x, **kw), oracle(m, x, _vis(kw)))


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 513, 1000])
def test_odd_lengths(n, fused):
    m = random_pom(4, degree=2)
    x = torch.randn(2, n, 4, dtype=torch.float64)
    for kw in (dict(), dict(causal=True), dict(causal=True, block_size=7)):
        vis = visibility(2, n, n, causal=kw.get("causal", False), block_size=kw.get("block_size"))
        assert_close(m(x, **kw), oracle(m, x, vis))


def test_long_causal_float32_accuracy(fused):
    """fp32 causal mean over 20k tokens stays at fp32 accuracy (chunked prefix sums, fp32 accumulation)."""
    m = random_pom(8, degree=2).float()
    x = torch.randn(1, 20000, 8)
    y = m(x, causal=True)
    # the paper's running mean written out in float64 (the N×N oracle would need 3 GB here)
    W, c = m.in_proj.weight.double(), m.coeff.double()
    z = x.double() @ W.T
    h = torch.nn.functional.leaky_relu(z[..., :16], 0.01).clamp(-0.1, 6.0)
    poly = c[:, 0] * h + c[:, 1] * h**2
    H = poly.cumsum(1) / torch.arange(1, 20001, dtype=torch.float64)[:, None]
    s = torch.nn.functional.hardsigmoid(z[..., 16:] + m.gate_bias.double())
    ref = (s * H) @ m.out_proj.weight.double().T + m.out_proj.bias.double()
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(causal=True, block_size=3),
                                dict(mask="key"), dict(mask="general"), dict(mask="general", causal=True)],
                         ids=["full", "causal", "block", "key", "general", "general-causal"])
@pytest.mark.parametrize("M", [5, 37, 50])
def test_cross_mixing(kw, M, fused):
    m = random_pom(D_MODEL, sel_heads=2)
    Nc = 37
    x = torch.randn(B, M, D_MODEL, dtype=torch.float64)
    ctx = torch.randn(B, Nc, D_MODEL, dtype=torch.float64)
    kw = dict(kw)
    if kw.get("mask") == "key":
        kw["mask"] = torch.rand(B, Nc) > 0.4
    elif kw.get("mask") == "general":
        kw["mask"] = torch.rand(B, M, Nc) > 0.4
    assert_close(m(x, ctx, **kw), oracle(m, x, _vis(kw, M=M, K=Nc), context=ctx))


def test_query_seeing_nothing_gets_zero_mix_not_nan(fused):
    m = random_pom(D_MODEL)
    x = torch.randn(B, N, D_MODEL, dtype=torch.float64, requires_grad=True)
    general = torch.rand(B, N, N) > 0.5
    general[:, 3] = False  # query 3 sees nothing
    key = torch.ones(B, N, dtype=torch.bool)
    key[0] = False  # the whole first sequence is padding
    for kw in (dict(mask=general), dict(mask=key), dict(mask=key, causal=True), dict(mask=key, causal=True,
                                                                                      block_size=4)):
        y = m(x, **kw)
        ref = oracle(m, x.detach(), _vis(kw))
        assert_close(y, ref)
        y.sum().backward()
        assert torch.isfinite(x.grad).all()
        x.grad = None
    # an empty view leaves exactly the output bias
    y = m(x, mask=key)
    assert_close(y[0], m.out_proj.bias.expand(N, -1).detach())


def test_permutation_equivariance_full_mode_only(fused):
    m = random_pom(D_MODEL)
    x = torch.randn(B, N, D_MODEL, dtype=torch.float64)
    perm = torch.randperm(N)
    assert_close(m(x[:, perm]), m(x)[:, perm])
    # a key-padding mask permuted with the tokens keeps equivariance
    km = torch.rand(B, N) > 0.3
    assert_close(m(x[:, perm], mask=km[:, perm]), m(x, mask=km)[:, perm])
    # causal mode depends on order
    diff = (m(x[:, perm], causal=True) - m(x, causal=True)[:, perm]).abs().max()
    assert diff > 1e-3


@pytest.mark.parametrize("sel_heads", [1, 4])
@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(causal=True, block_size=6), dict(mask="key"),
                                dict(mask="key", causal=True), dict(mask="general")],
                         ids=["full", "causal", "block", "key", "key-causal", "general"])
def test_rope_1d_matches_relative_reference(kw, sel_heads):
    m = random_pom(D_MODEL, rope="1d", sel_heads=sel_heads, rope_base=50.0)
    x = torch.randn(B, N, D_MODEL, dtype=torch.float64)
    kw = dict(kw)
    if kw.get("mask") == "key":
        kw["mask"] = torch.rand(B, N) > 0.3
    elif kw.get("mask") == "general":
        kw["mask"] = torch.rand(B, N, N) > 0.3
    pos = torch.randint(0, 1000, (B, N))
    y = m(x, positions=pos, **kw)
    assert_close(y, oracle(m, x, _vis(kw), positions=pos))
    # default positions are the token index
    assert_close(m(x, **kw), oracle(m, x, _vis(kw), positions=torch.arange(N)))


def test_rope_2d_matches_relative_reference(fused):
    from polymixer.layers.positions import grid_positions

    m = random_pom(D_MODEL, rope="2d", rope_base=20.0)
    x = torch.randn(B, 30, D_MODEL, dtype=torch.float64)
    pos = grid_positions(5, 6)
    for kw in (dict(), dict(causal=True, block_size=6)):
        assert_close(m(x, positions=pos, **kw), oracle(m, x, _vis(kw, M=30, K=30), positions=pos))


def test_rope_cross_with_context_positions():
    m = random_pom(D_MODEL, rope="1d")
    x = torch.randn(B, 9, D_MODEL, dtype=torch.float64)
    ctx = torch.randn(B, 13, D_MODEL, dtype=torch.float64)
    qp, kp = torch.randint(0, 50, (9,)), torch.randint(0, 50, (13,))
    y = m(x, ctx, positions=qp, context_positions=kp)
    assert_close(y, oracle(m, x, _vis({}, M=9, K=13), context=ctx, positions=qp, context_positions=kp))


@pytest.mark.parametrize("rope", ["1d", "2d"])
@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(causal=True, block_size=4)],
                         ids=["full", "causal", "block"])
def test_rope_shift_invariance(rope, kw):
    """Shifting every position by the same offset leaves the output unchanged (relative positions only)."""
    m = random_pom(D_MODEL, rope=rope).float()
    x = torch.randn(B, 24, D_MODEL)
    if rope == "1d":
        pos = torch.arange(24)
        shift = torch.tensor(12345)
    else:
        pos = torch.stack([torch.arange(24) // 6, torch.arange(24) % 6], -1)
        shift = torch.tensor([321, -77])
    y0 = m(x, positions=pos, **kw)
    y1 = m(x, positions=pos + shift, **kw)
    torch.testing.assert_close(y1, y0, rtol=1e-4, atol=1e-5)
    # but positions do matter
    other = pos.flip(0)
    assert (m(x, positions=other, **kw) - y0).abs().max() > 1e-4


def test_rope_with_zero_positions_is_plain_pom():
    m = random_pom(D_MODEL, rope="1d")
    plain = random_pom(D_MODEL)
    plain.load_state_dict(m.state_dict())
    x = torch.randn(B, N, D_MODEL, dtype=torch.float64)
    zeros = torch.zeros(N, dtype=torch.long)
    assert_close(m(x, causal=True, positions=zeros), plain(x, causal=True))


@pytest.mark.parametrize("grad", [True, False], ids=["training-path", "inference-path"])
def test_bf16_close_to_fp32(fused, grad):
    m = PoM(64, degree=3)
    with torch.no_grad():
        m.coeff.uniform_(-0.5, 0.5)
    x = torch.randn(2, 600, 64)
    mb = PoM(64, degree=3).to(torch.bfloat16)
    mb.load_state_dict(m.state_dict())
    for kw in (dict(), dict(causal=True), dict(causal=True, block_size=16)):
        with torch.set_grad_enabled(grad):
            y = m(x, **kw)
            yb = mb(x.bfloat16(), **kw)
        assert yb.dtype == torch.bfloat16
        err = (yb.float() - y).norm() / y.norm()
        assert err < 2e-2, (kw, err)


@pytest.mark.parametrize("grad", [True, False], ids=["training-path", "inference-path"])
def test_autocast_bf16_runs_and_is_close(fused, grad):
    m = PoM(32)
    with torch.no_grad():
        m.coeff.uniform_(-0.5, 0.5)
    x = torch.randn(2, 600, 32, requires_grad=grad)
    for kw in (dict(), dict(causal=True)):
        with torch.set_grad_enabled(grad):
            y = m(x, **kw)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                yb = m(x, **kw)
        assert yb.dtype == torch.bfloat16
        assert (yb.float() - y).norm() / y.norm() < 2e-2
        if grad:
            yb.float().sum().backward()
            assert torch.isfinite(x.grad).all()


def test_inference_and_training_paths_agree(fused):
    m = random_pom(16, sel_heads=4).float()
    x = torch.randn(3, 700, 16)
    for kw in (dict(), dict(causal=True)):
        with torch.no_grad():
            y0 = m(x, **kw)
        y1 = m(x, **kw)
        torch.testing.assert_close(y0, y1, rtol=1e-5, atol=1e-6)


def test_fused_and_modular_agree_float32():
    from polymixer import functional as Fn

    m = random_pom(16).float()
    x = torch.randn(2, 1300, 16, requires_grad=True)
    for kw in (dict(), dict(causal=True)):
        y1 = m(x, **kw)
        g1 = torch.autograd.grad(y1.square().sum(), [x, m.coeff, m.gate_bias, m.in_proj.weight])
        with Fn.fused_kernels(False):
            y2 = m(x, **kw)
            g2 = torch.autograd.grad(y2.square().sum(), [x, m.coeff, m.gate_bias, m.in_proj.weight])
        torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-6)
        for a, b in zip(g1, g2):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_reference_checkpoint_roundtrip_and_semantics():
    """The reference's names load, and the loaded module computes the reference formula with its defaults."""
    d, D, k = 8, 16, 2
    sd = {
        "qc_proj.weight": torch.randn(2 * D, d),
        "se_bias": torch.randn(D),
        "po_coeff": torch.randn(D, k),
        "ag_proj.weight": torch.randn(d, D),
        "ag_proj.bias": torch.randn(d),
    }
    m = PoM(d, degree=k, expand=2, bias=True)
    m.load_reference_state_dict(sd)
    assert torch.equal(m.reference_state_dict()["qc_proj.weight"], sd["qc_proj.weight"])
    x = torch.randn(2, 11, d)
    # the reference computes: h = clamp(leaky_relu(x W_c^T, .01), -.1, 6); poly = Σ_p coeff_p h^p; mean over
    # tokens; s = hardsigmoid(x W_s^T + se_bias); out = ag_proj(s * H)
    z = x @ sd["qc_proj.weight"].T
    h = torch.nn.functional.leaky_relu(z[..., :D], 0.01).clamp(-0.1, 6.0)
    poly = sum(sd["po_coeff"][:, p] * h ** (p + 1) for p in range(k))
    H = poly.mean(1, keepdim=True)
    s = torch.nn.functional.hardsigmoid(z[..., D:] + sd["se_bias"])
    expected = (s * H) @ sd["ag_proj.weight"].T + sd["ag_proj.bias"]
    torch.testing.assert_close(m(x), expected, rtol=1e-5, atol=1e-5)
    # with a prefix (a layer inside a model)
    m2 = PoM(d, degree=k, expand=2, bias=True)
    m2.load_reference_state_dict({f"blocks.3.attn.{n}": t for n, t in sd.items()}, prefix="blocks.3.attn.")
    torch.testing.assert_close(m2(x), expected, rtol=1e-5, atol=1e-5)


def test_reference_checkpoint_multihead_gate():
    d, D, heads = 8, 16, 4
    sd = {"qc_proj.weight": torch.randn(D + heads, d), "se_bias": torch.randn(heads), "po_coeff": torch.randn(D, 3),
          "ag_proj.weight": torch.randn(d, D)}
    m = PoM(d, degree=3, sel_heads=heads)
    m.load_reference_state_dict(sd)
    assert m.gate_dim == heads


def test_init_follows_reference():
    m = PoM(64, degree=3, expand=2)
    assert m.in_proj.weight.shape == (128 + 128, 64) and m.in_proj.bias is None
    assert m.coeff.shape == (128, 3) and m.coeff.abs().max() <= 1e-3
    assert torch.count_nonzero(m.gate_bias) == 0
    assert m.out_proj.bias is None
    assert PoM(64, bias=True).out_proj.bias is not None
    assert PoM(64, expand=1.5).poly_dim == 96


@pytest.mark.parametrize("rope", ["1d", "2d"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sel_heads", [1, 4])
def test_fused_rotary_across_tiles_matches_modular(rope, causal, sel_heads):
    """Rotary on the fused path (tiles of 512 tokens, running sums carried across tiles) == the modular path, for
    outputs and every gradient, with per-row positions."""
    from polymixer import functional as Fn

    m = random_pom(8, rope=rope, sel_heads=sel_heads, rope_base=100.0)
    B, N = 2, 1100
    x = torch.randn(B, N, 8, dtype=torch.float64, requires_grad=True)
    if rope == "1d":
        pos = torch.randint(0, 5000, (B, N))
    else:
        pos = torch.randint(0, 40, (B, N, 2))
    params = [x, m.coeff, m.gate_bias, m.in_proj.weight, m.out_proj.weight]
    y1 = m(x, causal=causal, positions=pos)
    g1 = torch.autograd.grad(y1.square().sum(), params)
    with torch.no_grad():
        y0 = m(x, causal=causal, positions=pos)  # the inference tiles
    with Fn.fused_kernels(False):
        y2 = m(x, causal=causal, positions=pos)
        g2 = torch.autograd.grad(y2.square().sum(), params)
    assert_close(y1, y2)
    assert_close(y0, y2)
    for a, b in zip(g1, g2):
        assert_close(a, b, rtol=1e-9, atol=1e-9)
