"""The gated value-carrying PoM: the chunked torch form against the float64 oracle that follows the formula
literally (explicit decay weights exp(−|Λ_i − Λ_j|)), in every mode, outputs and gradients; streaming equals the
parallel causal form; packed sequences equal separate calls; one entry of the mixer table that every family builds."""

from __future__ import annotations

import os

import pytest
import torch

from polymixer import GatedValuePoM, PoM, ValuePoM
from polymixer.blocks import build_mixer, mixer_spec
from polymixer.ops.gated_value_pom import retnet_bias
from polymixer.ops.gated_value_pom.modular import gated_scan
from polymixer.reference import reference_gated


def _module(**kw):
    torch.manual_seed(0)
    m = GatedValuePoM(8, value_dim=8, heads=2, chunk_size=4, degree=3, **kw).double()
    with torch.no_grad():  # a data-dependent decay with a visible range of rates
        m.decay_proj.weight.normal_(0, 0.5)
        m.decay_proj.bias.normal_(0, 1.0)
    return m


def _oracle(m, x, **kw):
    return reference_gated(x, m.weights, heads=m.heads, rope=m.rope, **kw)


MODES = [("causal", dict(causal=True)), ("full", dict()), ("block 3", dict(causal=True, block_size=3)),
         ("block 5", dict(causal=True, block_size=5)), ("block 1", dict(causal=True, block_size=1))]


@pytest.mark.parametrize("mode,kw", MODES, ids=[m for m, _ in MODES])
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "key padding"])
def test_every_mode_against_the_oracle_with_gradients(mode, kw, masked):
    m = _module(token_shift=3)
    torch.manual_seed(1)
    x = torch.randn(2, 11, 8, dtype=torch.float64, requires_grad=True)
    mask = None
    if masked:
        mask = torch.rand(2, 11) > 0.3
        mask[:, 0] = True
    gy = torch.randn(2, 11, 8, dtype=torch.float64)
    y = m(x, mask=mask, **kw)
    grads = torch.autograd.grad((y * gy).sum(), [x] + list(m.parameters()))
    ref = _oracle(m, x, mask=mask, **kw)
    ref_grads = torch.autograd.grad((ref * gy).sum(), [x] + list(m.parameters()))
    torch.testing.assert_close(y, ref, rtol=1e-9, atol=1e-10)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-8, atol=1e-10)


def test_rotary_one_and_two_d_against_the_oracle():
    for rope, positions in (("1d", None), ("2d", torch.stack([torch.arange(12) // 4, torch.arange(12) % 4], -1))):
        m = _module(rope=rope)
        x = torch.randn(2, 12, 8, dtype=torch.float64)
        for kw in (dict(causal=True), dict()):
            torch.testing.assert_close(m(x, positions=positions, **kw), _oracle(m, x, positions=positions, **kw),
                                       rtol=1e-9, atol=1e-10)


def test_decay_matters_and_starts_at_retnets_rates():
    fresh = GatedValuePoM(8, value_dim=8, heads=4)
    gamma = torch.exp(-torch.nn.functional.softplus(fresh.decay_proj.bias.double()))
    torch.testing.assert_close(gamma, 1 - 2.0 ** (-5.0 - torch.arange(4, dtype=torch.float64)))
    torch.testing.assert_close(retnet_bias(4), fresh.decay_proj.bias.detach())
    m = _module()
    x = torch.randn(1, 9, 8, dtype=torch.float64)
    ungated = ValuePoM(8, value_dim=8, heads=2, chunk_size=4, degree=3).double()
    ungated.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("decay_proj")})
    assert (m(x, causal=True) - ungated(x, causal=True)).abs().max() > 1e-3  # the decay changes the output


def test_streaming_equals_the_parallel_causal_form():
    m = _module(token_shift=2, rope="1d")
    x = torch.randn(2, 13, 8, dtype=torch.float64)
    y = m(x, causal=True)
    state = m.init_state(2, dtype=torch.float64)
    outs = []
    for a, b in ((0, 1), (1, 6), (6, 7), (7, 13)):
        o, state = m.step(x[:, a:b], state)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, 1), y, rtol=1e-9, atol=1e-10)
    assert state.sum.shape == (2, 2, 8, 4) and int(state.offset[0]) == 13


@pytest.mark.parametrize("kw", [dict(causal=True), dict(), dict(causal=True, block_size=3)],
                         ids=["causal", "full", "block 3"])
def test_packed_sequences_equal_separate_calls(kw):
    m = _module(token_shift=3, rope="1d")
    lens = [5, 1, 7]
    x = torch.randn(sum(lens), 8, dtype=torch.float64)
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    y = m(x, cu_seqlens=cu, **kw)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        torch.testing.assert_close(y[a:b], m(x[None, a:b], **kw)[0], rtol=1e-9, atol=1e-10)


def test_scan_gradcheck_with_segments_and_a_carried_state():
    torch.manual_seed(3)
    B, H, N, Dh, E = 1, 2, 7, 3, 2
    q, k = torch.randn(B, H, N, Dh, dtype=torch.float64), torch.randn(B, H, N, Dh, dtype=torch.float64)
    v = torch.randn(B, H, N, E, dtype=torch.float64)
    g = -torch.rand(B, H, N, dtype=torch.float64)
    S = torch.randn(B, H, Dh, E, dtype=torch.float64)
    seg = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    inputs = [t.requires_grad_() for t in (q, k, v, g, S)]
    assert torch.autograd.gradcheck(lambda *a: gated_scan(a[0], a[1], a[2], a[3], seg, 3, a[4])[0], inputs)


def test_refusals_are_clear():
    m = _module()
    with pytest.raises(ValueError, match="cross-mixing"):
        m(torch.randn(1, 4, 8, dtype=torch.float64), torch.randn(1, 5, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="explicit"):
        m(torch.randn(1, 4, 8, dtype=torch.float64), mask=torch.ones(1, 4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="unexpected keyword argument 'decay'"):
        PoM(8, decay="head")  # a plain PoM: the gated one is GatedValuePoM


def test_one_entry_of_the_mixer_table_that_every_family_builds():
    from polymixer.models.registry import create_model

    spec = mixer_spec("G")
    assert spec.name == "gated_value_pom" and isinstance(build_mixer("gated_value_pom", 16, value_heads=2), PoM)
    lm = create_model("tiny-pom", mixer="PG", n_layer=2, n_embd=32, n_head=2, block_size=16)
    logits, _ = lm(torch.randint(0, 100, (2, 16)))
    assert logits.shape[:2] == (2, 16)
    img = create_model("tiny-sipom", mixer="G", input_size=8, hidden_size=32, depth=1)
    assert img(torch.randn(2, 1, 8, 8), torch.rand(2), torch.tensor([1, 2])).shape == (2, 1, 8, 8)
    eo = create_model("tiny-tsvipom", mixer="GA", image_size=4)
    out = eo(torch.randn(1, 3, 4, 4, 10), torch.randint(0, 365, (1, 3)))
    assert out.shape[0] == 1


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)],
                         ids=["fp32", "bf16"])
@pytest.mark.usefixtures("traced_kernels")
def test_triton_scan_matches_the_torch_form_forward_and_backward(dtype, device):
    """The Triton kernels (in the interpreter on CPU tensors, compiled with ``POLYMIXER_TEST_DEVICE=cuda``):
    segments that restart inside chunks and at their edges, a length that is no multiple of the chunk; the backward
    (three more scans and the log-decay identity) against autograd through the torch form."""
    pytest.importorskip("triton")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("CPU tensors need TRITON_INTERPRET=1")
    from polymixer.ops.gated_value_pom.modular import gated_mix
    from polymixer.ops.gated_value_pom.triton_kernels import triton_gated_scan

    torch.manual_seed(4)
    # chunks of 16 in the interpreter; a GPU takes its own (64 on sm_90): a longer row crosses them there too
    B, H, N, Dh, E = 2, 2, 37 if device.type == "cpu" else 150, 16, 8
    q, k = torch.randn(B, H, N, Dh), torch.randn(B, H, N, Dh)
    v = torch.randn(B, H, N, E)
    g = -torch.rand(B, H, N) * 0.5
    seq = torch.tensor([[0] * 16 + [1] * 5 + [2] * (N - 21), [0] * N])  # restarts at a chunk edge and inside one
    do = torch.randn(B, H, N, E)
    q, k, v, g, seq, do = (t.to(device) for t in (q, k, v, g, seq, do))
    for kw in (dict(causal=True, block_size=None), dict(causal=False, block_size=None),
               dict(causal=True, block_size=3)):
        leaves = [t.clone().to(dtype).requires_grad_() for t in (q, k, v)] + [g.clone().requires_grad_()]
        ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
        o, _ = gated_mix(*leaves, seq=seq, chunk=16, scan=triton_gated_scan, **kw)
        ref, _ = gated_mix(*ref_leaves, seq=seq, chunk=16, **kw)
        grads = torch.autograd.grad((o.float() * do).sum(), leaves)
        ref_grads = torch.autograd.grad((ref * do.double()).sum(), ref_leaves)
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        scale = ref.abs().max()
        assert (o.double() - ref).abs().max() / scale < tol, kw
        for a, r in zip(grads, ref_grads):
            assert (a.double() - r).abs().max() / r.abs().max() < tol * 3, kw
