"""Packed variable-length sequences (cu_seqlens) == padded batch == one run per sequence."""

from __future__ import annotations

import pytest
import torch

from polymixer.reference import visibility

from conftest import assert_close, oracle, random_pom

LENS = [5, 1, 17, 9, 30]


def _data(d=8):
    seqs = [torch.randn(n, d, dtype=torch.float64) for n in LENS]
    cu = torch.tensor([0] + torch.tensor(LENS).cumsum(0).tolist(), dtype=torch.int32)
    return seqs, cu


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(causal=True, block_size=4)],
                         ids=["full", "causal", "block"])
@pytest.mark.parametrize("rope", [None, "1d"])
def test_padded_packed_and_separate_agree(kw, rope, fused):
    m = random_pom(8, rope=rope, sel_heads=2)
    seqs, cu = _data()
    packed = m(torch.cat(seqs)[None], cu_seqlens=cu, **kw)[0]
    separate = torch.cat([m(s[None], **kw)[0] for s in seqs])
    assert_close(packed, separate)
    # right-padded batch with a key-padding mask
    L = max(LENS)
    padded = torch.zeros(len(LENS), L, 8, dtype=torch.float64)
    mask = torch.zeros(len(LENS), L, dtype=torch.bool)
    for i, s in enumerate(seqs):
        padded[i, : len(s)] = s
        mask[i, : len(s)] = True
    out = m(padded, mask=mask, **kw)
    assert_close(out[mask], packed)
    # and the oracle with the explicit block-diagonal visibility
    vis = visibility(1, cu[-1].item(), cu[-1].item(), causal=kw.get("causal", False),
                     block_size=kw.get("block_size"), cu_seqlens_k=cu)
    pos = None
    if rope:
        pos = torch.cat([torch.arange(n) for n in LENS])
    assert_close(packed[None], oracle(m, torch.cat(seqs)[None], vis, positions=pos))


def test_packed_2d_input_and_key_mask():
    m = random_pom(8)
    seqs, cu = _data()
    flat = torch.cat(seqs)
    y = m(flat, cu_seqlens=cu, causal=True)
    assert y.shape == flat.shape
    km = torch.rand(1, flat.shape[0]) > 0.3
    out = m(flat[None], cu_seqlens=cu, causal=True, mask=km)
    vis = visibility(1, flat.shape[0], flat.shape[0], causal=True, cu_seqlens_k=cu, key_mask=km)
    assert_close(out, oracle(m, flat[None], vis))


@pytest.mark.parametrize("causal", [False, True])
def test_packed_cross_mixing(causal):
    m = random_pom(8)
    q_lens, k_lens = [3, 8, 2], [5, 4, 9]
    cq = torch.tensor([0, 3, 11, 13], dtype=torch.int32)
    ck = torch.tensor([0, 5, 9, 18], dtype=torch.int32)
    x = torch.randn(1, sum(q_lens), 8, dtype=torch.float64)
    c = torch.randn(1, sum(k_lens), 8, dtype=torch.float64)
    y = m(x, c, cu_seqlens=(cq, ck), causal=causal)
    vis = visibility(1, 13, 18, causal=causal, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert_close(y, oracle(m, x, vis, context=c))


def test_packed_long_stream_no_cancellation():
    """Thousands of short packed documents: the restart-at-boundary prefix sum keeps fp32 accuracy."""
    m = random_pom(8, degree=2).float()
    with torch.no_grad():
        m.coeff.mul_(30)  # large features make any long-range cancellation visible
    lens = torch.randint(1, 12, (3000,))
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).int()
    x = torch.randn(1, int(cu[-1]), 8)
    y = m(x, cu_seqlens=cu, causal=True)
    # per-document float64 computation (exact reference) for the last documents of the stream
    m64 = random_pom(8, degree=2)
    m64.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
    for i in range(2990, 3000):
        a, b = int(cu[i]), int(cu[i + 1])
        ref = m64(x[:, a:b].double(), causal=True)
        torch.testing.assert_close(y[:, a:b].double(), ref, rtol=1e-5, atol=1e-4)
