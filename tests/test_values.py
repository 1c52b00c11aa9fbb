"""The value-carrying PoM (``ValuePoM``), tested as the core is: the float64 oracle built from the explicit
visibility matrix for every mode, gradcheck, padded == packed == per sequence, chunked streaming == parallel,
compile, nothing quadratic, and clear errors."""

from __future__ import annotations

import pytest
import torch

from polymixer import PoM, PoMState, ValuePoM
from polymixer.reference import reference_value_pom, shift_validity, visibility
from polymixer.values import value_pom

f64 = torch.float64


def vpom(dim=8, value_dim=8, heads=2, degree=3, expand=1.5, **kw):
    """A value-carrying PoM in float64 with non-trivial coefficients, gate bias, shift and norm gains."""
    m = ValuePoM(dim, degree=degree, expand=expand, value_dim=value_dim, heads=heads, bias=True, **kw).double()
    with torch.no_grad():
        m.coeff.uniform_(-0.6, 0.6)
        m.coeff_q.uniform_(-0.6, 0.6)
        m.gate_bias.uniform_(-1, 1)
        m.norm_weight.uniform_(0.5, 1.5)
        if m.token_shift:
            m.shift.uniform_(-1, 1)
    return m


def oracle(m, x, vis, context=None, has_prev=None, **kw):
    return reference_value_pom(x, m.weights, context, vis=vis, heads=m.heads, has_prev=has_prev, gate=m.gate,
                               reduction=m.reduction, rope=m.rope, **kw)


def close(a, b, tol=1e-10):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


MODES = [dict(), dict(causal=True), dict(causal=True, block_size=4), dict(causal=True, block_size=5),
         dict(causal=True, block_size=50)]
MODE_IDS = ["full", "causal", "block4", "block5", "block>chunk"]


@pytest.mark.parametrize("kw", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("variant", [dict(), dict(heads=1, sel_heads=4), dict(token_shift=False),
                                     dict(reduction="sum", gate="sigmoid"), dict(rope="1d"), dict(token_shift=4)],
                         ids=["default", "one-head-gate-heads", "no-shift", "sum-sigmoid", "rope", "conv4"])
def test_every_mode_matches_the_oracle(kw, variant):
    m = vpom(chunk_size=8, **variant)
    B, N = 2, 37
    x = torch.randn(B, N, 8, dtype=f64)
    vis = visibility(B, N, N, causal=kw.get("causal", False), block_size=kw.get("block_size"))
    extra = dict(positions=torch.arange(N)) if m.rope else {}
    close(m(x, **kw), oracle(m, x, vis, **extra))


@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_matches_the_oracle(causal):
    m = vpom(chunk_size=8)
    B, N = 3, 29
    x = torch.randn(B, N, 8, dtype=f64)
    km = torch.rand(B, N) > 0.3
    km[:, 0] = True
    km[2, :10] = False  # left padding
    y = m(x, mask=km, causal=causal)
    r = oracle(m, x, visibility(B, N, N, causal=causal, key_mask=km), has_prev=shift_validity(B, N, km))
    close(y[km], r[km])


def test_general_mask_matches_the_oracle():
    m = vpom()
    B, N = 2, 19
    x = torch.randn(B, N, 8, dtype=f64)
    gm = torch.rand(B, N, N) > 0.5
    gm[:, 3] = False  # a query that sees nothing gets 0 from the mixer (then the output bias)
    close(m(x, mask=gm), oracle(m, x, visibility(B, N, N, mask=gm)))
    close(m(x, mask=gm, causal=True), oracle(m, x, visibility(B, N, N, mask=gm, causal=True)))


@pytest.mark.parametrize("M", [11, 23, 40])
@pytest.mark.parametrize("kw", MODES[:3], ids=MODE_IDS[:3])
def test_cross_mixing_matches_the_oracle(M, kw):
    m = vpom(chunk_size=8, rope="1d")
    B, N = 2, 23
    x, ctx = torch.randn(B, M, 8, dtype=f64), torch.randn(B, N, 8, dtype=f64)
    pos, cpos = torch.arange(M) + 3, torch.arange(N)
    vis = visibility(B, M, N, causal=kw.get("causal", False), block_size=kw.get("block_size"))
    close(m(x, ctx, positions=pos, context_positions=cpos, **kw),
          oracle(m, x, vis, context=ctx, positions=pos, context_positions=cpos))


def test_2d_rotary_matches_the_oracle_and_is_translation_invariant():
    m = ValuePoM(8, degree=2, expand=2, value_dim=8, heads=2, rope="2d").double()  # 8 key channels per head
    with torch.no_grad():
        m.coeff.uniform_(-0.6, 0.6)
        m.coeff_q.uniform_(-0.6, 0.6)
    B, side = 2, 5
    pos = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1).reshape(-1, 2)
    x = torch.randn(B, side * side, 8, dtype=f64)
    y = m(x, positions=pos)
    close(y, oracle(m, x, visibility(B, side * side, side * side), positions=pos))
    close(m(x, positions=pos + torch.tensor([7, -3])), y)


@pytest.mark.parametrize("causal", [False, True])
def test_padded_equals_packed_equals_per_sequence(causal):
    m = vpom(chunk_size=8, rope="1d")
    lens = [5, 12, 1, 19]
    seqs = [torch.randn(1, n, 8, dtype=f64) for n in lens]
    one_by_one = torch.cat([m(s, causal=causal) for s in seqs], 1)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    packed = m(torch.cat(seqs, 1), cu_seqlens=cu, causal=causal)
    close(packed, one_by_one)
    close(m(torch.cat(seqs, 1)[0], cu_seqlens=cu, causal=causal), one_by_one[0])  # a (T, d) input
    L = max(lens)
    padded = torch.zeros(len(lens), L, 8, dtype=f64)
    km = torch.zeros(len(lens), L, dtype=torch.bool)
    for i, s in enumerate(seqs):
        padded[i, :lens[i]], km[i, :lens[i]] = s[0], True
    close(m(padded, mask=km, causal=causal)[km], one_by_one[0])
    vis = visibility(1, sum(lens), sum(lens), causal=causal, cu_seqlens_k=cu)
    close(packed, oracle(m, torch.cat(seqs, 1), vis, has_prev=shift_validity(1, sum(lens), None, cu),
                         positions=torch.cat([torch.arange(n) for n in lens])))


@pytest.mark.parametrize("causal", [False, True])
def test_packed_short_sequences_with_key_padding(causal):
    # causal packing mixes in place (chunks straddle sequences, the state restarts); a key mask applies as well
    m = vpom(chunk_size=4, rope="1d")
    lens = [3, 1, 9, 2, 7, 5, 1, 1, 4]
    T = sum(lens)
    x = torch.randn(1, T, 8, dtype=f64)
    km = torch.rand(1, T) > 0.3
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    packed = m(x, cu_seqlens=cu, mask=km, causal=causal)
    parts = [m(x[:, a:b], mask=km[:, a:b], causal=causal) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
    close(packed, torch.cat(parts, 1))


def test_packed_causal_gradcheck():
    torch.manual_seed(2)
    m = vpom(dim=4, value_dim=4, heads=2, degree=2, expand=2, rope="1d")
    x = torch.randn(1, 9, 4, dtype=f64, requires_grad=True)
    cu = torch.tensor([0, 2, 3, 7, 9], dtype=torch.int32)
    params = [m.in_proj.weight, m.coeff, m.coeff_q, m.shift]

    def f(x, w, c, cq, sh):
        weights = m.weights._replace(in_weight=w, coeff=c, coeff_q=cq, shift_weight=sh)
        return value_pom(x, weights, heads=2, rope="1d", chunk=2, gate="sigmoid", causal=True, cu_seqlens=cu)
    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5)


def test_packed_cross_mixing_equals_per_sequence():
    m = vpom()
    lq, lk = [4, 9], [7, 3]
    xs = [torch.randn(1, n, 8, dtype=f64) for n in lq]
    cs = [torch.randn(1, n, 8, dtype=f64) for n in lk]
    cu = lambda ls: torch.tensor([0, *torch.tensor(ls).cumsum(0).tolist()], dtype=torch.int32)  # noqa: E731
    for causal in (False, True):
        packed = m(torch.cat(xs, 1), torch.cat(cs, 1), cu_seqlens=(cu(lq), cu(lk)), causal=causal)
        close(packed, torch.cat([m(a, c, causal=causal) for a, c in zip(xs, cs)], 1))


@pytest.mark.parametrize("rope", [None, "1d"])
def test_chunked_streaming_equals_parallel(rope):
    m = vpom(chunk_size=4, rope=rope)
    B, N = 3, 41
    x = torch.randn(B, N, 8, dtype=f64)
    km = torch.ones(B, N, dtype=torch.bool)
    km[1, :6] = False  # a left-padded prompt
    full = m(x, causal=True, mask=km, positions=(torch.arange(N) - (~km).sum(1, keepdim=True)).clamp(min=0)
             if rope else None)
    gen = torch.Generator().manual_seed(0)
    state, outs, i = m.init_state(B, dtype=f64), [], 0
    if rope:
        state.offset -= (~km).sum(1)  # the padded row's real tokens start at position 0
    while i < N:
        t = int(torch.randint(1, 9, (1,), generator=gen))
        pos = None
        if rope:
            pos = (state.offset.unsqueeze(1) + torch.arange(min(t, N - i))).clamp(min=0)
        y, state = m.step(x[:, i:i + t], state, mask=km[:, i:i + t], positions=pos)
        outs.append(y)
        i += t
    close(torch.cat(outs, 1)[km], full[km])
    assert state.sum.shape == (B, 2, 6, 4) and state.prev.shape == (B, 1, 12 + 8)


@pytest.mark.parametrize("causal", [False, True])
def test_a_wider_shift_matches_the_oracle_with_padding_and_packing(causal):
    # token_shift=W: a causal depthwise convolution over the last W tokens; a masked token counts as zero and no tap
    # reaches across a sequence start
    m = vpom(chunk_size=4, token_shift=4, rope="1d")
    assert m.shift.shape == (4, 12 + 8) and m.shift_width == 4
    lens = [5, 1, 2, 9, 3, 6]
    T = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    x = torch.randn(1, T, 8, dtype=f64)
    km = torch.rand(1, T) > 0.25
    packed = m(x, cu_seqlens=cu, mask=km, causal=causal)
    vis = visibility(1, T, T, causal=causal, key_mask=km, cu_seqlens_k=cu)
    pos = torch.cat([torch.arange(n) for n in lens])
    close(packed, oracle(m, x, vis, has_prev=shift_validity(1, T, km, cu, lags=3), positions=pos))
    parts = [m(x[:, a:b], mask=km[:, a:b], causal=causal) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
    close(packed, torch.cat(parts, 1))
    B, N = 3, 23
    xb = torch.randn(B, N, 8, dtype=f64)
    kb = torch.rand(B, N) > 0.3
    vis = visibility(B, N, N, causal=causal, key_mask=kb)
    close(m(xb, mask=kb, causal=causal, positions=torch.arange(N)),
          oracle(m, xb, vis, has_prev=shift_validity(B, N, kb, lags=3), positions=torch.arange(N)))


def test_a_wider_shift_streams_and_starts_as_the_token_shift():
    m = vpom(chunk_size=4, token_shift=5)
    B, N = 2, 40
    x = torch.randn(B, N, 8, dtype=f64)
    km = torch.rand(B, N) > 0.2
    full = m(x, causal=True, mask=km)
    gen = torch.Generator().manual_seed(1)
    state, outs, i = m.init_state(B, dtype=f64), [], 0
    assert state.prev.shape == (B, 4, 12 + 8) and m.state_floats == 12 * 8 // 2 + 4 * (12 + 8)
    while i < N:  # chunks shorter than the 4 remembered tokens as well
        t = int(torch.randint(1, 7, (1,), generator=gen))
        y, state = m.step(x[:, i:i + t], state, mask=km[:, i:i + t])
        outs.append(y)
        i += t
    close(torch.cat(outs, 1), full)
    narrow, wide = ValuePoM(8, value_dim=8, heads=2), ValuePoM(8, value_dim=8, heads=2, token_shift=4)
    wide.load_state_dict({**narrow.state_dict(), "shift": torch.cat([narrow.shift, torch.zeros(2, 24)])})
    fresh = ValuePoM(8, value_dim=8, heads=2, token_shift=4).shift
    assert torch.equal(fresh[:2], narrow.shift) and not fresh[2:].any()  # the extra taps start at zero
    xs = torch.randn(2, 10, 8)
    torch.testing.assert_close(wide(xs, causal=True), narrow(xs, causal=True))


def test_a_wider_shift_gradcheck():
    torch.manual_seed(3)
    m = vpom(dim=4, value_dim=4, heads=2, degree=2, expand=2, token_shift=3)
    x = torch.randn(1, 9, 4, dtype=f64, requires_grad=True)
    cu = torch.tensor([0, 2, 3, 7, 9], dtype=torch.int32)
    km = torch.tensor([[True, False] + [True] * 7])
    for kw in (dict(causal=True, cu_seqlens=cu), dict(causal=True, mask=km)):
        def f(x, w, sh):
            return value_pom(x, m.weights._replace(in_weight=w, shift_weight=sh), heads=2, chunk=2, gate="sigmoid",
                             **kw)
        assert torch.autograd.gradcheck(f, (x, m.in_proj.weight, m.shift), eps=1e-6, atol=1e-5), kw


def test_block_causal_streaming_equals_parallel():
    m = vpom()
    x = torch.randn(2, 30, 8, dtype=f64)
    state, outs = m.init_state(2, dtype=f64), []
    for i in range(0, 30, 6):
        y, state = m.step(x[:, i:i + 6], state, causal=False)
        outs.append(y)
    close(torch.cat(outs, 1), m(x, causal=True, block_size=6))


def test_state_reorders_concatenates_and_keeps_its_size():
    m = vpom()
    x = torch.randn(4, 12, 8, dtype=f64)
    _, state = m.step(x, m.init_state(4, dtype=f64))
    order = torch.tensor([2, 0, 3, 1])
    moved = state.index_select(order)
    y_moved, _ = m.step(x[order, :3], moved)
    y, _ = m.step(x[:, :3], state)
    close(y_moved, y[order])
    both = PoMState.cat([state[0], state[1:]])
    close(both.sum, state.sum)
    close(both.prev, state.prev)
    _, longer = m.step(torch.randn(4, 100, 8, dtype=f64), state)
    assert longer.sum.shape == state.sum.shape and m.state_floats == 12 * 8 // 2 + 12 + 8
    assert state.detach().to("cpu").prev is not None


def test_gradcheck():
    torch.manual_seed(1)
    m = vpom(dim=4, value_dim=4, heads=2, degree=2, expand=2, chunk_size=2, rope="1d")
    x = torch.randn(2, 7, 4, dtype=f64, requires_grad=True)
    params = [m.in_proj.weight, m.coeff, m.coeff_q, m.shift, m.norm_weight, m.gate_bias]
    km = torch.tensor([[True] * 7, [False, False] + [True] * 5])
    for kw in (dict(causal=True), dict(causal=True, block_size=3), dict(), dict(mask=km, causal=True)):
        def f(x, *ps):
            weights = m.weights._replace(in_weight=ps[0], coeff=ps[1], coeff_q=ps[2], shift_weight=ps[3],
                                         norm_weight=ps[4], gate_bias=ps[5])
            return value_pom(x, weights, heads=2, rope="1d", chunk=2, gate="sigmoid", **kw)
        assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5), kw


@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=True, block_size=64), dict(),
                                dict(causal=True, cu_seqlens=[0, 100, 1500, 2048]),
                                dict(causal=True, cu_seqlens=[0, 1500, *range(1501, 2049)])],
                         ids=["causal", "block", "full", "packed", "packed-short"])
def test_nothing_quadratic(kw):
    """No N × N tensor, forward or backward: the chunked form's largest tensors are (chunk × chunk) per chunk."""
    from test_functional import _Largest

    B, N = 1, 2048
    m = ValuePoM(16, value_dim=16, heads=2)
    x = torch.randn(B, N, 16, requires_grad=True)
    kw = dict(kw)
    if kw.get("cu_seqlens"):  # causal packing never pads (548 one-token documents beside one of 1,500)
        kw["cu_seqlens"] = torch.tensor(kw["cu_seqlens"], dtype=torch.int32)
    with _Largest() as rec:
        m(x, **kw).sum().backward()
    assert rec.largest <= 3 * N * m.chunk_size * m.heads < N * N, rec.shape


def test_compiled_equals_eager():
    torch._dynamo.reset()
    m = ValuePoM(16, value_dim=16, heads=2, rope="1d")
    cm = torch.compile(m, fullgraph=True)
    x = torch.randn(2, 100, 16, requires_grad=True)
    for kw in (dict(causal=True), dict()):
        y = m(x, **kw)
        g = torch.autograd.grad(y.square().sum(), [x, m.coeff, m.shift])
        yc = cm(x, **kw)
        gc = torch.autograd.grad(yc.square().sum(), [x, m.coeff, m.shift])
        torch.testing.assert_close(yc, y, rtol=1e-4, atol=1e-5)
        for a, b in zip(gc, g):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    torch._dynamo.reset()


def test_bf16_within_tolerance_of_fp32():
    m = ValuePoM(32, value_dim=32, heads=4)
    x = torch.randn(2, 70, 32)
    with torch.no_grad():
        y = m(x, causal=True)
        yb = m.to(torch.bfloat16)(x.bfloat16(), causal=True)
    assert yb.dtype == torch.bfloat16
    assert float((yb.float() - y).norm() / y.norm()) < 0.05


def test_bad_inputs_give_clear_errors():
    with pytest.raises(ValueError, match="heads = 3 must divide"):
        ValuePoM(8, value_dim=8, heads=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'heads'"):
        PoM(8, heads=2)  # a plain PoM: the value-carrying one is ValuePoM
    with pytest.raises(ValueError, match="value_dim = 6 is not divisible by sel_heads = 4"):
        ValuePoM(8, value_dim=6, sel_heads=4)
    with pytest.raises(ValueError, match="1-D rotary needs an even expand·dim / heads"):
        ValuePoM(6, expand=1, value_dim=6, heads=2, rope="1d")
    m = ValuePoM(8, value_dim=8, heads=2)
    with pytest.raises(ValueError, match="needs its own init_state"):
        m.step(torch.randn(1, 2, 8), PoM(8).init_state(1))
    with pytest.raises(ValueError, match=r"state has shape \(1, 2, 8, 4\)"):
        m.step(torch.randn(2, 2, 8), m.init_state(1))
    with pytest.raises(ValueError, match="no value-carrying PoM"):
        m.load_reference_state_dict({})
    with pytest.raises(ValueError, match="8 features but the mixer was built for dim=8|has 4 features"):
        m(torch.randn(1, 3, 4))
    with pytest.raises(ValueError, match="token_shift must be a bool or a width ≥ 2"):
        ValuePoM(8, value_dim=8, token_shift=1)
    with pytest.raises(ValueError, match=r"keeps the last 3 tokens: prev must be \(B, 3, C\)"):
        ValuePoM(8, value_dim=8, heads=2, token_shift=4).step(torch.randn(1, 2, 8), m.init_state(1))
