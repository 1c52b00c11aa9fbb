"""PolyMorpher: one residual block for every mixer; masks and streaming state pass through."""

from __future__ import annotations

import pytest
import torch

from polymixer import Attention, PoM, PolyMorpher

from conftest import assert_close


def _block(mixer, **kw):
    torch.manual_seed(1)
    b = PolyMorpher(16, mixer=mixer, **kw).double().eval()
    if isinstance(b.mixer, PoM):
        with torch.no_grad():
            b.mixer.coeff.uniform_(-1, 1)
    return b


@pytest.mark.parametrize("mixer", ["pom", "attention", "local_attention"])
def test_pre_norm_residual_structure(mixer):
    b = _block(mixer, heads=4) if mixer != "pom" else _block(mixer)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    h = x + b.mixer(b.norm1(x), causal=True)
    assert_close(b(x, causal=True), h + b.mlp(b.norm2(h)))


def test_post_norm_residual_structure():
    b = _block("pom", norm_first=False)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    h = b.norm1(x + b.mixer(x))
    assert_close(b(x), b.norm2(h + b.mlp(h)))


def test_mixer_kwargs_and_modules():
    assert isinstance(PolyMorpher(16, "pom", degree=3, expand=1).mixer, PoM)
    la = PolyMorpher(16, "local_attention", heads=2).mixer
    assert isinstance(la, Attention) and la.window == 128 and la.causal
    custom = PoM(16, degree=4)
    assert PolyMorpher(16, mixer=custom).mixer is custom
    assert PolyMorpher(16, mlp_ratio=2.0).mlp.fc1.out_features == 32


@pytest.mark.parametrize("mixer", ["pom", "attention", "local_attention"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_block_streaming_equals_forward(mixer, norm_first):
    kw = dict(heads=4, window=5) if mixer == "local_attention" else dict(heads=4) if mixer == "attention" else {}
    b = _block(mixer, norm_first=norm_first, **kw)
    x = torch.randn(2, 23, 16, dtype=torch.float64)
    full = b(x, causal=True)
    st = b.init_state(2)
    ys = []
    for a in range(0, 23, 4):
        y, st = b.step(x[:, a:a + 4], st)
        ys.append(y)
    assert_close(torch.cat(ys, 1), full)


def test_hybrid_stack_streams_with_mask():
    """A P/L/A pattern stack (the LM hybrid) streamed over a left-padded batch matches its parallel forward."""
    blocks = [_block("pom"), _block("local_attention", heads=4, window=6), _block("attention", heads=4)]
    x = torch.randn(2, 30, 16, dtype=torch.float64)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[0, :7] = False
    h = x
    for blk in blocks:
        h = blk(h, causal=True, mask=mask)
    states = [blk.init_state(2) for blk in blocks]
    outs = []
    for a in range(0, 30, 11):
        g = x[:, a:a + 11]
        for i, blk in enumerate(blocks):
            g, states[i] = blk.step(g, states[i], mask=mask[:, a:a + 11])
        outs.append(g)
    assert_close(torch.cat(outs, 1)[mask], h[mask])


def test_dropout_only_in_training():
    b = PolyMorpher(16, "attention", heads=4, dropout=0.5)
    assert b.mixer.dropout == 0.5
    x = torch.randn(2, 8, 16)
    b.eval()
    torch.testing.assert_close(b(x), b(x))
    b.train()
    assert not torch.allclose(b(x), b(x))


def test_gradients_reach_every_parameter():
    for mixer in ("pom", "attention", "local_attention"):
        b = PolyMorpher(16, mixer, **({} if mixer == "pom" else {"heads": 4}))
        b(torch.randn(2, 9, 16), causal=True).square().sum().backward()
        missing = [n for n, p in b.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
        assert not missing, missing
