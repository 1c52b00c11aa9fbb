"""Streaming with init_state / step reproduces the parallel forward; the state is O(D) and batch-indexable."""

from __future__ import annotations

import random

import pytest
import torch

from polymixer import PoM, PoMState

from conftest import assert_close, random_pom


def _random_chunks(n: int, rng: random.Random):
    out, i = [], 0
    while i < n:
        c = rng.choice([1, 1, 2, 3, 7, 16, 40])
        out.append((i, min(n, i + c)))
        i += c
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rope", [None, "1d"])
@pytest.mark.parametrize("sel_heads", [1, 4])
def test_chunked_streaming_equals_causal_forward(seed, rope, sel_heads):
    m = random_pom(8, rope=rope, sel_heads=sel_heads)
    x = torch.randn(3, 100, 8, dtype=torch.float64)
    full = m(x, causal=True)
    state = m.init_state(3)
    outs = []
    for a, b in _random_chunks(100, random.Random(seed)):
        y, state = m.step(x[:, a:b], state)
        outs.append(y)
    assert_close(torch.cat(outs, 1), full)
    assert state.sum.shape == (3, m.poly_dim) and int(state.offset[0]) == 100


def test_token_by_token_equals_causal_forward():
    m = random_pom(8)
    x = torch.randn(2, 50, 8, dtype=torch.float64)
    state = m.init_state(2)
    ys = []
    for t in range(50):
        y, state = m.step(x[:, t:t + 1], state)
        ys.append(y)
    assert_close(torch.cat(ys, 1), m(x, causal=True))


@pytest.mark.parametrize("K", [1, 4, 7, 50])
@pytest.mark.parametrize("rope", [None, "1d"])
def test_frames_equal_block_causal_forward(K, rope):
    m = random_pom(8, rope=rope)
    x = torch.randn(2, 45, 8, dtype=torch.float64)  # 45 is not a multiple of 4, 7 or 50
    full = m(x, causal=True, block_size=K)
    state = m.init_state(2)
    ys = []
    for a in range(0, 45, K):
        y, state = m.step(x[:, a:a + K], state, causal=False)
        ys.append(y)
    assert_close(torch.cat(ys, 1), full)


def test_rope_2d_frames_with_explicit_positions():
    from polymixer.layers.positions import grid_positions

    m = random_pom(8, rope="2d")
    x = torch.randn(2, 24, 8, dtype=torch.float64)
    frame = grid_positions(2, 3)  # 6 tokens per frame, positions repeat per frame (a video's spatial grid)
    pos = frame.repeat(4, 1)
    full = m(x, causal=True, block_size=6, positions=pos)
    state = m.init_state(2)
    ys = []
    for f in range(4):
        y, state = m.step(x[:, 6 * f:6 * f + 6], state, causal=False, positions=frame)
        ys.append(y)
    assert_close(torch.cat(ys, 1), full)


def test_masked_streaming_equals_masked_forward():
    """Left-padded prompts: padded tokens are not counted, in streaming as in the parallel forward."""
    m = random_pom(8, rope="1d")
    x = torch.randn(3, 30, 8, dtype=torch.float64)
    mask = torch.ones(3, 30, dtype=torch.bool)
    mask[1, :5] = False
    mask[2, :11] = False
    full = m(x, causal=True, mask=mask)
    state = m.init_state(3)
    y1, state = m.step(x[:, :17], state, mask=mask[:, :17])
    y2, state = m.step(x[:, 17:], state, mask=mask[:, 17:])
    got = torch.cat([y1, y2], 1)
    assert_close(got[mask], full[mask])
    assert torch.equal(state.count, mask.sum(1).double())


def test_state_is_constant_size_and_fp32_under_bf16():
    m = PoM(16).to(torch.bfloat16)
    state = m.init_state(2)
    assert state.sum.dtype == torch.float32 and state.count.dtype == torch.float32
    size0 = sum(t.numel() for t in (state.sum, state.count, state.offset))
    for _ in range(20):
        y, state = m.step(torch.randn(2, 50, 16, dtype=torch.bfloat16), state)
        assert y.dtype == torch.bfloat16
    assert state.sum.dtype == torch.float32
    assert sum(t.numel() for t in (state.sum, state.count, state.offset)) == size0
    assert int(state.offset[0]) == 1000


def test_bf16_streaming_close_to_fp32():
    m = PoM(32)
    with torch.no_grad():
        m.coeff.uniform_(-0.5, 0.5)
    x = torch.randn(2, 200, 32)
    ref = m(x, causal=True)
    mb = PoM(32).to(torch.bfloat16)
    mb.load_state_dict(m.state_dict())
    st = mb.init_state(2)
    ys = []
    for a in range(0, 200, 13):
        y, st = mb.step(x[:, a:a + 13].bfloat16(), st)
        ys.append(y)
    got = torch.cat(ys, 1).float()
    assert (got - ref).norm() / ref.norm() < 2e-2


def test_state_index_reorder_and_cat():
    m = random_pom(8)
    x = torch.randn(4, 20, 8, dtype=torch.float64)
    state = m.init_state(4)
    _, state = m.step(x[:, :12], state)
    order = torch.tensor([2, 0, 0, 3])  # beam search: reorder and duplicate
    re = state[order]
    assert isinstance(re, PoMState) and re.batch_size == 4
    y, _ = m.step(x[order, 12:], re)
    assert_close(y, m(x[order], causal=True)[:, 12:])
    # compaction: keep rows 1 and 3, then merge back a fresh row
    kept = state.index_select(torch.tensor([1, 3]))
    y, _ = m.step(x[[1, 3], 12:], kept)
    assert_close(y, m(x[[1, 3]], causal=True)[:, 12:])
    assert state[1].batch_size == 1 and state[-1].batch_size == 1
    both = PoMState.cat([state[:2], state[2:]])
    assert torch.equal(both.sum, state.sum)
    # state survives a device move keeping fp32 accumulation
    moved = state.to("cpu", torch.bfloat16)
    assert moved.sum.dtype == state.sum.dtype


def test_step_errors():
    m = random_pom(8)
    state = m.init_state(2)
    with pytest.raises(ValueError, match="batch"):
        m.step(torch.randn(3, 4, 8, dtype=torch.float64), state)
    with pytest.raises(TypeError, match="PoMState"):
        m.step(torch.randn(2, 4, 8, dtype=torch.float64), {"h": 0})
    with pytest.raises(ValueError, match="batch_size"):
        m.init_state(0)
    other = random_pom(8, expand=3).init_state(2)
    with pytest.raises(ValueError, match="D="):
        m.step(torch.randn(2, 4, 8, dtype=torch.float64), other)
    with pytest.raises(ValueError, match="mask"):
        m.step(torch.randn(2, 4, 8, dtype=torch.float64), state, mask=torch.ones(2, 5, dtype=torch.bool))
    r2 = random_pom(8, rope="2d")
    with pytest.raises(ValueError, match="positions"):
        r2.step(torch.randn(2, 4, 8, dtype=torch.float64), r2.init_state(2))
