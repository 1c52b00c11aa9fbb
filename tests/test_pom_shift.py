"""PoM's token shift (``PoM(..., token_shift=W)``: h_j = Σ_t shift_t ⊙ W_h c_{j−t} before the polynomial, the gate
rows unshifted): the torch form against the float64 oracle — outputs and gradients — in every mode, packed against
padded, streams against the parallel causal form, the layer without a shift unchanged, and what refuses it."""

from __future__ import annotations

import pytest
import torch

import polymixer
from conftest import assert_close, random_pom
from polymixer import PoM
from polymixer.ops.pom import backend_for
from polymixer.ops.pom.call import make_pom_call

F64 = torch.float64


def _shifted_pom(W: int = 3, dim: int = 8, **kw) -> PoM:
    m = random_pom(dim, token_shift=W, **kw)
    with torch.no_grad():
        m.shift.normal_()  # every tap matters (the initial shift is the identity)
    return m


def _both(m: PoM, x: torch.Tensor, *args, **modes):
    """(output, gradients of x, the context and every parameter) on the torch form, then on the oracle."""
    out = []
    for name in ("torch", "reference"):
        inputs = [t.detach().clone().requires_grad_(True) for t in (x, *args)]
        m.zero_grad()
        with polymixer.backend(name):
            y = m(*inputs, **modes)
        y.square().sum().backward()
        out.append((y, [t.grad for t in inputs] + [p.grad for p in m.parameters()]))
    return out


MODES = {
    "full": {},
    "causal": {"causal": True},
    "block-causal": {"causal": True, "block_size": 3},
    "rope relative": {"causal": True, "rope": "1d"},
    "rope reference": {"rope": "1d", "rope_convention": "reference"},
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("W", [2, 4])
def test_torch_equals_the_oracle_with_gradients(mode, W):
    modes = dict(MODES[mode])
    layer = {k: modes.pop(k) for k in ("rope", "rope_convention") if k in modes}
    m = _shifted_pom(W, **layer)
    x = torch.randn(2, 9, 8, dtype=F64)
    mask = torch.rand(2, 9) > 0.3
    for kw in (modes, {**modes, "mask": mask}):  # and with key padding
        (y, grads), (yr, grads_r) = _both(m, x, **kw)
        assert_close(y, yr, 1e-9, 1e-9)
        for g, gr in zip(grads, grads_r):
            assert_close(g, gr, 1e-9, 1e-9)
    assert m.shift.grad.abs().min() > 0  # every tap learns


def test_cross_mixing_shifts_the_context_tokens():
    """Cross-mixing shifts W_h c along the context (as the value PoM does), with its key padding."""
    m = _shifted_pom(3)
    x, ctx = torch.randn(2, 5, 8, dtype=F64), torch.randn(2, 7, 8, dtype=F64)
    mask = torch.rand(2, 7) > 0.3
    (y, grads), (yr, grads_r) = _both(m, x, ctx, mask=mask)
    assert_close(y, yr, 1e-9, 1e-9)
    for g, gr in zip(grads, grads_r):
        assert_close(g, gr, 1e-9, 1e-9)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_equals_padded_and_restarts_at_each_sequence(causal):
    m = _shifted_pom(4, rope="1d")
    lens = [3, 6, 2]
    x = torch.randn(sum(lens), 8, dtype=F64)
    cu = torch.tensor([0, 3, 9, 11], dtype=torch.int32)
    (y, _), (yr, _) = _both(m, x, cu_seqlens=cu, causal=causal)
    assert_close(y, yr, 1e-9, 1e-9)
    for i, n in enumerate(lens):  # each sequence alone: the shift reads nothing of the one before
        alone = m(x[cu[i]:cu[i] + n].unsqueeze(0), causal=causal)[0]
        assert_close(y[cu[i]:cu[i] + n], alone, 1e-9, 1e-9)
    padded = torch.zeros(3, 6, 8, dtype=F64)
    keep = torch.zeros(3, 6, dtype=torch.bool)
    for i, n in enumerate(lens):
        padded[i, :n], keep[i, :n] = x[cu[i]:cu[i] + n], True
    assert_close(m(padded, mask=keep, causal=causal)[keep], y, 1e-9, 1e-9)


def test_general_mask_and_masked_tokens_count_as_zero():
    """A (B, M, N) mask decides what each query sees, not what the shift reads; a key-padded token reads as zero."""
    m = _shifted_pom(2)
    x = torch.randn(1, 6, 8, dtype=F64)
    vis = torch.rand(1, 6, 6) > 0.4
    (y, _), (yr, _) = _both(m, x, mask=vis)
    assert_close(y, yr, 1e-9, 1e-9)
    keep = torch.ones(1, 6, dtype=torch.bool)
    keep[0, 2] = False
    changed = x.clone()
    changed[0, 2] = 100.0  # a padded token: no other token sees its value
    assert_close(m(changed, mask=keep, causal=True)[keep], m(x, mask=keep, causal=True)[keep])


@pytest.mark.parametrize("W", [2, 5])
def test_streams_equal_the_parallel_forward(W):
    """Chunks of 1–4 tokens (shorter than the shift too) reproduce the causal form; frames the block-causal one;
    left padding is skipped by the shift as by the sum."""
    m = _shifted_pom(W, rope="1d")
    x = torch.randn(2, 13, 8, dtype=F64)
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[1, :4] = False
    full = m(x, causal=True, mask=mask)
    state, ys, t = m.init_state(2), [], 0
    for n in (1, 4, 2, 1, 3, 2):
        y, state = m.step(x[:, t:t + n], state, mask=mask[:, t:t + n])
        ys.append(y)
        t += n
    assert_close(torch.cat(ys, 1)[mask], full[mask])
    assert tuple(state.prev.shape) == (2, W - 1, m.poly_dim)
    frames = m(x[:, :12], causal=True, block_size=4)
    state, ys = m.init_state(2), []
    for t in range(0, 12, 4):
        y, state = m.step(x[:, t:t + 4], state, causal=False)
        ys.append(y)
    assert_close(torch.cat(ys, 1), frames)


def test_without_a_shift_nothing_changes_and_with_one_it_starts_as_none():
    """W = 0 / None / False: the same parameters (names and draws), state and outputs as a PoM built without the
    argument; a PoM with a shift starts equal to the one without (its shift is the identity), its state dict adds
    only ``shift``."""
    torch.manual_seed(0)
    plain = PoM(8, bias=True)
    x = torch.randn(2, 6, 8)
    for off in (0, None, False):
        torch.manual_seed(0)
        m = PoM(8, bias=True, token_shift=off)
        assert m.state_dict().keys() == plain.state_dict().keys() and m.shift_width == 0
        assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), plain.state_dict().values()))
        assert torch.equal(m(x, causal=True), plain(x, causal=True)) and m.init_state(2).prev is None
        assert m.weights.shift_weight is None
    torch.manual_seed(0)
    shifted = PoM(8, bias=True, token_shift=True)
    assert shifted.shift_width == 2 and set(shifted.state_dict()) - set(plain.state_dict()) == {"shift"}
    assert torch.equal(shifted.shift, torch.tensor([[1.0] * 16, [0.0] * 16]))
    assert all(torch.equal(shifted.state_dict()[k], v) for k, v in plain.state_dict().items())
    with polymixer.backend("torch"):
        assert torch.equal(shifted(x, causal=True), plain(x, causal=True))
    assert shifted.state_floats == 2 * plain.state_floats and "shift_width=2" in repr(shifted)


def test_the_backends_say_why_they_leave_it_to_the_torch_form():
    m = _shifted_pom(2, dim=8, dtype=torch.float32)
    x = torch.randn(1, 6, 8)
    found = backend_for(x, m.weights, causal=True)
    assert found["backend"] == "torch" and found["passed_over"]["cpu"] == "a token shift is not fused"
    with polymixer.backend("cpu"), pytest.raises(NotImplementedError, match="a token shift is not fused"):
        m(x, causal=True)
    call = make_pom_call(x, m.weights, None, dict(causal=True))
    pytest.importorskip("triton")
    from polymixer.ops.pom import triton_kernels

    assert triton_kernels.kernel_limits(call) == "a token shift is not in the kernels"


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="token_shift must be a bool or a width ≥ 2"):
        PoM(8, token_shift=1)
    m, plain = _shifted_pom(3), random_pom(8)
    x = torch.randn(1, 4, 8, dtype=F64)
    with pytest.raises(ValueError, match=r"shift_weight has shape \(3, 8\), expected \(W, D = 16\)"):
        polymixer.functional.pom(x, m.weights._replace(shift_weight=m.shift[:, :8]))
    with pytest.raises(ValueError, match="this PoM's token shift needs"):
        m.step(x, plain.init_state(1))
    with pytest.raises(ValueError, match="state keeps the last projections"):
        plain.step(x, m.init_state(1))
    with pytest.raises(ValueError, match="has no token shift"):
        m.load_reference_state_dict(plain.reference_state_dict())


def test_lm_configs_give_p_layers_the_shift_as_pom_shift():
    """``pom_shift`` reaches the P layers (a model's ``token_shift`` is the value PoMs'); without it, the keys of a
    PoM model's state dict are unchanged; set over a model without P layers, it is refused."""
    from polymixer.models import create_model
    from polymixer.models.registry import check_overrides

    shifted = create_model("tiny-pom-paper", device="meta", pom_shift=4)
    plain = create_model("tiny-pom-paper", device="meta")
    poms = [m for m in shifted.modules() if type(m) is PoM]
    assert poms and all(m.shift_width == 4 for m in poms)
    assert all(m.shift_width == 0 for m in plain.modules() if type(m) is PoM)
    extra = set(shifted.state_dict()) - set(plain.state_dict())
    assert extra and all(k.endswith(".shift") for k in extra) and set(plain.state_dict()) <= set(shifted.state_dict())
    with pytest.raises(ValueError, match="pom_shift=4 is taken by no mixer of this model"):
        check_overrides("tiny-vpom", {"pom_shift": 4})
    with pytest.raises(ValueError, match="pom_shift must be a bool or a width ≥ 2"):
        create_model("tiny-pom-paper", device="meta", pom_shift=1)
