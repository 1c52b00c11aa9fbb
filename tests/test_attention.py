"""The attention baseline against softmax attention written out in float64, and its KV-cache streaming."""

from __future__ import annotations

import random

import pytest
import torch

from polymixer import Attention, LocalAttention
from polymixer.functional import rope_angles, rotate
from polymixer.reference import reference_attention, visibility

from conftest import assert_close

B, N, DIM, H = 2, 29, 16, 4


def _shifted(m: Attention, t, key_mask=None):
    """The token shift written out: t'_j = Σ_s w[s] ⊙ t_{j−s}, masked tokens and tokens before the first as 0."""
    if not m.shift_width:
        return t
    t = t if key_mask is None else t * key_mask[..., None]
    out = torch.zeros_like(t)
    for j in range(t.shape[1]):
        for s in range(m.shift_width):
            if j - s >= 0:
                out[:, j] += m.shift[s].double() * t[:, j - s]
    return out


def _ref(m: Attention, x, vis, context=None, positions=None, context_positions=None, key_mask=None):
    W, b = m.qkv.weight.double(), m.qkv.bias.double()
    c = x if context is None else context
    q = x @ W[:DIM].T + b[:DIM]
    kv = _shifted(m, c @ W[DIM:].T + b[DIM:], key_mask)
    k, v = kv[..., :DIM], kv[..., DIM:]
    heads = lambda t: t.view(t.shape[0], t.shape[1], H, DIM // H).transpose(1, 2)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    if m.rope:
        two_d = m.rope == "2d"
        cq, sq = rope_angles(positions, DIM // H, m.rope_base, two_d, torch.float64)
        kp = positions if context_positions is None else context_positions
        ck, sk = rope_angles(kp, DIM // H, m.rope_base, two_d, torch.float64)
        if cq.dim() == 3:  # per-batch positions: broadcast over heads
            cq, sq, ck, sk = (t.unsqueeze(1) for t in (cq, sq, ck, sk))
        q, k = rotate(q, cq, sq), rotate(k, ck, sk)
    o = reference_attention(q, k, v, vis)
    o = o.transpose(1, 2).reshape(x.shape[0], x.shape[1], DIM)
    return o @ m.proj.weight.double().T + m.proj.bias.double()


def _att(window=None, **kw):
    """Attention, or with a window LocalAttention."""
    m = Attention(DIM, heads=H, **kw) if window is None else LocalAttention(DIM, window, heads=H, **kw)
    return m.double()


MODES = {
    "full": dict(),
    "causal": dict(causal=True),
    "block": dict(causal=True, block_size=5),
    "key": dict(mask="key"),
    "key-causal": dict(mask="key", causal=True),
    "general": dict(mask="general"),
}


def _materialise(kw, M=N, K=N):
    kw = dict(kw)
    if kw.get("mask") == "key":
        kw["mask"] = torch.rand(B, K) > 0.3
    elif kw.get("mask") == "general":
        kw["mask"] = torch.rand(B, M, K) > 0.3
    m = kw.get("mask")
    vis = visibility(B, M, K, causal=kw.get("causal", False), block_size=kw.get("block_size"),
                     key_mask=m if m is not None and m.dim() == 2 else None,
                     mask=m if m is not None and m.dim() == 3 else None)
    return kw, vis


@pytest.mark.parametrize("mode", list(MODES))
def test_modes_match_reference(mode):
    m = _att()
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    kw, vis = _materialise(MODES[mode])
    assert_close(m(x, **kw), _ref(m, x, vis))


@pytest.mark.parametrize("mode", ["full", "causal", "key"])
@pytest.mark.parametrize("M", [7, 40])
def test_cross_attention(mode, M):
    m = _att()
    x = torch.randn(B, M, DIM, dtype=torch.float64)
    c = torch.randn(B, N, DIM, dtype=torch.float64)
    kw, vis = _materialise(MODES[mode], M=M, K=N)
    assert_close(m(x, c, **kw), _ref(m, x, vis, context=c))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [1, 4, 8, 40])
@pytest.mark.parametrize("key_mask", [False, True])
def test_sliding_window_blockwise_matches_reference(causal, window, key_mask):
    m = _att(window=window)
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    km = (torch.rand(B, N) > 0.3) if key_mask else None
    vis = visibility(B, N, N, causal=causal, window=window, key_mask=km)
    assert_close(m(x, causal=causal, mask=km), _ref(m, x, vis))


def test_rope_attention_matches_reference():
    m = _att(rope="1d")
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    pos = torch.randint(0, 500, (B, N))
    vis = visibility(B, N, N, causal=True)
    assert_close(m(x, causal=True, positions=pos), _ref(m, x, vis, positions=pos))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 4])
def test_packed_equals_separate(causal, window):
    m = _att(window=window)
    lens = [3, 11, 1, 14]
    seqs = [torch.randn(1, n, DIM, dtype=torch.float64) for n in lens]
    cu = torch.tensor([0, 3, 14, 15, 29], dtype=torch.int32)
    packed = m(torch.cat(seqs, 1), cu_seqlens=cu, causal=causal)
    assert_close(packed, torch.cat([m(s, causal=causal) for s in seqs], 1))


def test_empty_rows_are_zero_not_nan():
    m = _att()
    x = torch.randn(B, N, DIM, dtype=torch.float64, requires_grad=True)
    km = torch.ones(B, N, dtype=torch.bool)
    km[1] = False
    y = m(x, mask=km)
    assert_close(y[1], m.proj.bias.double().expand(N, -1).detach())
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def _chunks(n, seed):
    rng, out, i = random.Random(seed), [], 0
    while i < n:
        c = rng.choice([1, 1, 2, 5, 9, 13])
        out.append((i, min(n, i + c)))
        i += c
    return out


@pytest.mark.parametrize("window", [None, 3, 8])
@pytest.mark.parametrize("rope", [None, "1d"])
@pytest.mark.parametrize("seed", [0, 1])
def test_kv_cache_streaming_equals_forward(window, rope, seed):
    m = _att(window=window, rope=rope)
    x = torch.randn(B, 60, DIM, dtype=torch.float64)
    full = m(x, causal=True)
    st = m.init_state(B)
    ys = []
    for a, b in _chunks(60, seed):
        y, st = m.step(x[:, a:b], st)
        ys.append(y)
    assert_close(torch.cat(ys, 1), full)
    if window is not None:  # the ring buffer never grows
        assert st.k.shape[2] == window


def test_kv_cache_frames_equal_block_causal():
    m = _att()
    x = torch.randn(B, 22, DIM, dtype=torch.float64)
    full = m(x, causal=True, block_size=5)
    st = m.init_state(B)
    ys = []
    for a in range(0, 22, 5):
        y, st = m.step(x[:, a:a + 5], st, causal=False)
        ys.append(y)
    assert_close(torch.cat(ys, 1), full)


@pytest.mark.parametrize("window", [None, 4])
def test_kv_cache_left_padding(window):
    m = _att(window=window)
    x = torch.randn(B, 20, DIM, dtype=torch.float64)
    mask = torch.ones(B, 20, dtype=torch.bool)
    mask[1, :6] = False
    full = m(x, causal=True, mask=mask)
    st = m.init_state(B)
    y1, st = m.step(x[:, :9], st, mask=mask[:, :9])
    y2, st = m.step(x[:, 9:], st, mask=mask[:, 9:])
    got = torch.cat([y1, y2], 1)
    assert_close(got[mask], full[mask])


def test_kv_cache_reorder():
    m = _att()
    x = torch.randn(3, 12, DIM, dtype=torch.float64)
    st = m.init_state(3)
    _, st = m.step(x[:, :7], st)
    order = torch.tensor([2, 2, 0])
    y, _ = m.step(x[order, 7:], st[order])
    assert_close(y, m(x[order], causal=True)[:, 7:])
    with pytest.raises(ValueError, match="batch"):
        m.step(x[:2, 7:], st)


# -- the token shift (a short causal convolution of keys and values), offered to attention as to the value PoM ----


def _shift_att(width, **kw):
    m = _att(token_shift=width, **kw)
    with torch.no_grad():
        m.shift.copy_(torch.randn_like(m.shift))
    return m


def test_token_shift_is_off_by_default_and_checked():
    assert not any("shift" in k for k in _att().state_dict())
    assert _att(token_shift=True).shift.shape == (2, 2 * DIM)
    init = _att(token_shift=4).shift
    assert init[:2].eq(0.5).all() and init[2:].eq(0).all() and init.no_weight_decay
    with pytest.raises(ValueError, match="token_shift must be"):
        _att(token_shift=1)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("width", [2, 4])
def test_token_shift_matches_reference(mode, width):
    m = _shift_att(width, rope="1d")
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    kw, vis = _materialise(MODES[mode])
    km = kw.get("mask") if kw.get("mask") is not None and kw["mask"].dim() == 2 else None
    pos = torch.arange(N)
    assert_close(m(x, positions=pos, **kw), _ref(m, x, vis, positions=pos, key_mask=km))


def test_token_shift_cross_attention_shifts_the_context():
    m = _shift_att(3)
    x, c = torch.randn(B, 7, DIM, dtype=torch.float64), torch.randn(B, N, DIM, dtype=torch.float64)
    km = torch.rand(B, N) > 0.3
    vis = visibility(B, 7, N, key_mask=km)
    assert_close(m(x, c, mask=km), _ref(m, x, vis, context=c, key_mask=km))


@pytest.mark.parametrize("window", [None, 4])
def test_token_shift_packed_equals_separate(window):
    m = _shift_att(3, window=window)
    lens = [3, 11, 1, 14]
    seqs = [torch.randn(1, n, DIM, dtype=torch.float64) for n in lens]
    cu = torch.tensor([0, 3, 14, 15, 29], dtype=torch.int32)
    assert_close(m(torch.cat(seqs, 1), cu_seqlens=cu, causal=True), torch.cat([m(s, causal=True) for s in seqs], 1))


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("width", [2, 5])
def test_token_shift_streaming_equals_forward(window, width):
    m = _shift_att(width, window=window, rope="1d")
    x = torch.randn(B, 40, DIM, dtype=torch.float64)
    mask = torch.ones(B, 40, dtype=torch.bool)
    mask[1, :6] = False  # left padding: never part of the shift
    full = m(x, causal=True, mask=mask)
    st = m.init_state(B)
    ys = []
    for a, b in _chunks(40, width):
        y, st = m.step(x[:, a:b], st, mask=mask[:, a:b])
        ys.append(y)
    assert_close(torch.cat(ys, 1)[mask], full[mask])
    assert st.shift_prev.shape == (B, width - 1, 2 * DIM) and st[[1, 0]].shift_prev.shape == st.shift_prev.shape
    with pytest.raises(ValueError, match="token shift"):
        _att(window=window).step(x[:, :2], st)
