"""Bad input gets a ValueError / TypeError that names the problem — never a silent wrong answer."""

from __future__ import annotations

import pytest
import torch

from polymixer import Attention, LocalAttention, PoM, PolyMorpher

X = torch.randn(2, 10, 8)


@pytest.fixture(params=["pom", "attention"])
def mixer(request):
    return PoM(8) if request.param == "pom" else Attention(8, heads=2)


@pytest.mark.parametrize("bad, exc, match", [
    (torch.randn(10, 8), ValueError, "rank 2"),
    (torch.randn(1, 2, 10, 8), ValueError, "rank 4"),
    (torch.randn(2, 10, 7), ValueError, "dim=8"),
    (torch.randn(2, 0, 8), ValueError, "empty sequence"),
    (torch.ones(2, 10, 8, dtype=torch.long), TypeError, "floating"),
    ([[1.0] * 8], TypeError, "tensor"),
])
def test_bad_tokens(mixer, bad, exc, match):
    with pytest.raises(exc, match=match):
        mixer(bad)


def test_context_mismatch(mixer):
    with pytest.raises(ValueError, match="context has 6 features"):
        mixer(X, torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match="context batch 3"):
        mixer(X, torch.randn(3, 5, 8))


@pytest.mark.parametrize("mask, exc, match", [
    (torch.ones(2, 10), TypeError, "bool"),
    (torch.ones(2, 10, dtype=torch.long), TypeError, "bool"),
    (torch.ones(2, 9, dtype=torch.bool), ValueError, r"\(2, 10\)"),
    (torch.ones(10, dtype=torch.bool), ValueError, "shape"),
    (torch.ones(2, 10, 9, dtype=torch.bool), ValueError, r"\(2, 10, 10\)"),
])
def test_bad_masks(mixer, mask, exc, match):
    with pytest.raises(exc, match=match):
        mixer(X, mask=mask)


@pytest.mark.parametrize("cu, exc, match", [
    (torch.tensor([0, 4, 10], dtype=torch.float32), TypeError, "int32"),
    (torch.tensor([1, 4, 10], dtype=torch.int32), ValueError, "start at 0"),
    (torch.tensor([0, 4, 9], dtype=torch.int32), ValueError, "end at the number of tokens 10"),
    (torch.tensor([0, 6, 4, 10], dtype=torch.int32), ValueError, "strictly increasing"),
    (torch.tensor([0, 4, 4, 10], dtype=torch.int32), ValueError, "empty sequence"),
    (torch.tensor([[0, 10]], dtype=torch.int32), ValueError, "1-D"),
    ([0, 10], TypeError, "tensor"),
])
def test_bad_cu_seqlens(mixer, cu, exc, match):
    with pytest.raises(exc, match=match):
        mixer(torch.randn(1, 10, 8), cu_seqlens=cu)


def test_packed_needs_batch_one(mixer):
    with pytest.raises(ValueError, match="batch size 1"):
        mixer(X, cu_seqlens=torch.tensor([0, 10], dtype=torch.int32))


@pytest.mark.parametrize("bs, exc, match", [(0, ValueError, "positive"), (-3, ValueError, "positive"),
                                            (2.5, TypeError, "int"), (True, TypeError, "int")])
def test_bad_block_size(mixer, bs, exc, match):
    with pytest.raises(exc, match=match):
        mixer(X, causal=True, block_size=bs)


def test_block_size_needs_causal(mixer):
    with pytest.raises(ValueError, match="causal=True"):
        mixer(X, block_size=4)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(degree=0), ValueError, "degree"),
    (dict(degree=2.0), TypeError, "degree"),
    (dict(expand=3, sel_heads=5), ValueError, "not divisible by sel_heads"),
    (dict(sel_heads=0), ValueError, "sel_heads"),
    (dict(expand=0), ValueError, "expand"),
    (dict(expand=1.3), ValueError, "integer"),
    (dict(gate="relu6"), ValueError, "unknown gate"),
    (dict(activation="swish2"), ValueError, "unknown activation"),
    (dict(reduction="max"), ValueError, "reduction"),
    (dict(rope="3d"), ValueError, "rope"),
])
def test_bad_pom_config(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        PoM(8, **kwargs)


def test_bad_rope_positions():
    m = PoM(8, rope="1d")
    with pytest.raises(ValueError, match="positions must have shape"):
        m(X, positions=torch.arange(9))
    m2 = PoM(8, rope="2d")
    with pytest.raises(ValueError, match=r"2-D rotary needs explicit positions"):
        m2(X)
    with pytest.raises(ValueError, match="positions must have shape"):
        m2(X, positions=torch.zeros(10, 3, dtype=torch.long))


def test_bad_attention_config():
    with pytest.raises(ValueError, match="not divisible by heads"):
        Attention(10, heads=3)
    with pytest.raises(ValueError, match="window must be a positive int"):
        LocalAttention(8, 0, heads=2)


def test_bad_block_config():
    with pytest.raises(ValueError, match="unknown mixer"):
        PolyMorpher(8, mixer="mamba")
    with pytest.raises(TypeError, match="unexpected keyword argument 'heads'"):
        PolyMorpher(8, mixer="pom", heads=2)  # only the value-carrying PoM has heads: the slip surfaces
    with pytest.raises(TypeError):
        PolyMorpher(8, mixer="pom", n_head=2)


def test_reference_loading_errors():
    m = PoM(8, degree=2)
    good = {k: v.clone() for k, v in m.reference_state_dict().items()}
    bad = dict(good)
    bad["po_coeff"] = torch.zeros(16, 3)
    with pytest.raises(ValueError, match=r"po_coeff has shape \(16, 3\), expected \(16, 2\)"):
        m.load_reference_state_dict(bad)
    missing = {k: v for k, v in good.items() if k != "se_bias"}
    with pytest.raises(ValueError, match="missing se_bias"):
        m.load_reference_state_dict(missing)
    with pytest.raises(ValueError, match="bias=False"):
        m.load_reference_state_dict({**good, "ag_proj.bias": torch.zeros(8)})
    with pytest.raises(ValueError, match="unexpected extra"):
        m.load_reference_state_dict({**good, "extra": torch.zeros(1)})
    before = m.coeff.detach().clone()
    with pytest.raises(ValueError):
        m.load_reference_state_dict(bad)
    assert torch.equal(m.coeff, before), "a failed load must not change the module"
