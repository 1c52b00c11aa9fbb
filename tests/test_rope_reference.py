"""PoM(rope_convention="reference") against the reference implementation's PoMRoPE (davidpicard/pom,
pom/pom_rope.py), in float64.

:class:`PoMRoPE64` restates PoMRoPE's forward formula by formula — its tables, ``apply_rope_1d`` /
``apply_rope_2d``, ``_rope`` with its strided tables for a gate per head, the polynomial, the aggregation per mask
and ``polynomial_selection_`` — in float64, with the reference's parameter and buffer names, so that its state dict
is a PoMRoPE checkpoint. (It was checked once against the real class run from the authors' source to ≤ 1e-12 in
float64; the suite cannot read that source.) Its tables are made in float32 as the reference makes them — that is
what a checkpoint holds and what ``load_reference_state_dict`` checks — and set to exact float64 ones
(:meth:`PoMRoPE64.exact_tables`) before the float64 comparisons.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import polymixer
from polymixer import PoM
from polymixer.layers.value_pom import GatedValuePoM, ValuePoM
from polymixer.ops.pom import backend_for, pom
from polymixer.ops.pom.call import make_pom_call
from polymixer.ops.value_pom import value_pom

F64 = torch.float64
DIM, DEGREE, EXPAND, L, GRID = 8, 3, 4, 64, 8  # D = 32 polynomial channels


# ------------------------------------------------------------------------------------------------------------------
# PoMRoPE, restated in float64
# ------------------------------------------------------------------------------------------------------------------


def tables_1d(dim, max_len, base, dtype):
    half = dim // 2
    inv_freq = 1.0 / (base ** (torch.arange(0, half, dtype=dtype) / half))
    angles = torch.outer(torch.arange(max_len, dtype=dtype), inv_freq)
    return angles.cos(), angles.sin()


def tables_2d(dim, max_h, max_w, base, dtype):
    quarter = dim // 4
    inv_freq = 1.0 / (base ** (torch.arange(0, quarter, dtype=dtype) / quarter))
    row = torch.outer(torch.arange(max_h, dtype=dtype), inv_freq)
    col = torch.outer(torch.arange(max_w, dtype=dtype), inv_freq)
    return row.cos(), row.sin(), col.cos(), col.sin()


def rope_1d(x, positions, cos, sin):
    half = x.shape[-1] // 2
    c, s = cos[positions], sin[positions]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rope_2d(x, positions_hw, row_cos, row_sin, col_cos, col_sin):
    q = x.shape[-1] // 4
    rc, rs = row_cos[positions_hw[:, 0]], row_sin[positions_hw[:, 0]]
    cc, cs = col_cos[positions_hw[:, 1]], col_sin[positions_hw[:, 1]]
    r1, r2, c1, c2 = x[..., :q], x[..., q:2 * q], x[..., 2 * q:3 * q], x[..., 3 * q:]
    return torch.cat([r1 * rc - r2 * rs, r2 * rc + r1 * rs, c1 * cc - c2 * cs, c2 * cc + c1 * cs], dim=-1)


class PoMRoPE64(nn.Module):
    """PoMRoPE (n_groups = 1) in float64: y = ag_proj(R_i s_i ⊙ agg_j(R_j poly(act(W_c x_j))))."""

    def __init__(self, dim, degree, expand, n_sel_heads, bias=False, rope_base=10000.0, rope_2d=False):
        super().__init__()
        self.D, self.degree, self.n_sel_heads, self.rope_2d, self.base = dim * expand, degree, n_sel_heads, rope_2d, \
            rope_base
        self.Ds = n_sel_heads if n_sel_heads > 1 else self.D
        self.head_dim = self.D // max(n_sel_heads, 1)
        g = torch.Generator().manual_seed(7)
        self.qc_proj = nn.Linear(dim, self.D + self.Ds, bias=False, dtype=F64)
        self.se_bias = nn.Parameter(0.5 * torch.randn(self.Ds, generator=g, dtype=F64))  # the reference: zeros
        self.po_coeff = nn.Parameter(0.5 * torch.randn(self.D, degree, generator=g, dtype=F64))  # (±1e-3 there)
        self.ag_proj = nn.Linear(self.D, dim, bias=bias, dtype=F64)
        self.set_tables(torch.float32)  # as the reference computes them

    def set_tables(self, dtype):
        if self.rope_2d:
            for name, t in zip(("row_cos", "row_sin", "col_cos", "col_sin"),
                               tables_2d(self.D, GRID, GRID, self.base, dtype)):
                self.register_buffer(name, t)
        else:
            cos, sin = tables_1d(self.D, L, self.base, dtype)
            self.register_buffer("freqs_cos", cos)
            self.register_buffer("freqs_sin", sin)

    def exact_tables(self):
        self.set_tables(F64)
        return self

    def rope(self, x, positions, positions_hw):
        if self.rope_2d:
            tabs = (self.row_cos, self.row_sin, self.col_cos, self.col_sin)
            if x.shape[-1] != self.D:  # the gate's heads: head k's leading frequency
                tabs = tuple(t[:, ::self.head_dim][:, :x.shape[-1] // 4] for t in tabs)
            return rope_2d(x, positions_hw, *tabs)
        if positions is None:
            positions = torch.arange(x.shape[1])
        cos, sin = self.freqs_cos, self.freqs_sin
        if x.shape[-1] != self.D:
            stride, half = self.head_dim // 2, x.shape[-1] // 2
            cos, sin = cos[:, ::stride][:, :half], sin[:, ::stride][:, :half]
        return rope_1d(x, positions, cos, sin)

    def forward(self, xq, xc=None, mask=None, positions=None, ctx_positions=None, positions_hw=None,
                ctx_positions_hw=None):
        self_mixing = xc is None
        xc = xq if xc is None else xc
        w = self.qc_proj.weight
        h = F.linear(xc, w[:self.D])
        s = F.hardsigmoid(F.linear(xq, w[self.D:]) + self.se_bias)
        a = torch.clamp(F.leaky_relu(h, 0.01), min=-0.1, max=6.0).unsqueeze(-1)
        powers = [a ** p for p in range(1, self.degree + 1)]
        h = (torch.cat(powers, dim=-1) * self.po_coeff).sum(-1)
        cpos = ctx_positions if ctx_positions is not None else (positions if self_mixing else None)
        cpos_hw = ctx_positions_hw if ctx_positions_hw is not None else (positions_hw if self_mixing else None)
        h = self.rope(h, cpos, cpos_hw)
        if mask is None:
            agg = h.mean(dim=1, keepdim=True)
        elif isinstance(mask, str):  # "causal"
            tril = torch.tril(torch.ones(h.shape[1], h.shape[1], dtype=F64))
            agg = torch.einsum("bnd,mn->bmd", h, tril) / tril.sum(1, keepdim=True)
        elif mask.dim() == 2:
            m = mask.unsqueeze(-1).to(F64)
            agg = (h * m).sum(1, keepdim=True) / m.sum(1, keepdim=True)
        else:
            m = mask.to(F64)
            agg = torch.einsum("bnd,bmn->bmd", h, m) / m.sum(2, keepdim=True)
        s = self.rope(s, positions, positions_hw)
        b, g, dh = agg.shape
        if self.n_sel_heads <= 1:
            sh = s * agg
        else:
            sh = s.unsqueeze(-1) * agg.view(b, g, self.n_sel_heads, dh // self.n_sel_heads)
        return self.ag_proj(sh.reshape(b, max(g, s.shape[1]), dh))


# ------------------------------------------------------------------------------------------------------------------
# the cases: PoMRoPE's modes, 1-D and 2-D, a gate per channel and 4 selection heads
# ------------------------------------------------------------------------------------------------------------------

B, M, N = 2, 10, 13


def grid(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, GRID, (n, 2), generator=g)


def case(mode, two_d):
    """(their keywords, ours, x, context) of a mode, with positions not in token order."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, N, DIM, generator=g, dtype=F64)
    pos = grid(N, 1) if two_d else torch.randperm(L, generator=g)[:N]
    key = "positions_hw" if two_d else "positions"
    if mode == "cross":
        xq = torch.randn(B, M, DIM, generator=g, dtype=F64)
        qpos = grid(M, 2) if two_d else torch.randperm(L, generator=g)[:M]
        vis = torch.rand(B, M, N, generator=g) > 0.4
        vis[:, :, 0] = True  # every query sees a token (the reference divides by the count)
        theirs = {"xc": x, "mask": vis, key: qpos, "ctx_" + key: pos}
        return theirs, {"mask": vis, "positions": qpos, "context_positions": pos}, xq, x
    if mode == "cross_default":  # positions left out: 0..M-1 and 0..N-1 (1-D only)
        xq = torch.randn(B, M, DIM, generator=g, dtype=F64)
        return {"xc": x}, {}, xq, x
    theirs, ours = {key: pos}, {"positions": pos}
    if mode == "causal":
        theirs["mask"], ours["causal"] = "causal", True
    if mode == "padding":
        keep = torch.rand(B, N, generator=g) > 0.3
        keep[:, 0] = True
        theirs["mask"], ours["mask"] = keep, keep
    return theirs, ours, x, None


def pair(sel_heads, two_d, bias=True):
    """(PoMRoPE64 with exact tables, our PoM loaded from its float32-table checkpoint)."""
    ref = PoMRoPE64(DIM, DEGREE, EXPAND, sel_heads, bias=bias, rope_2d=two_d)
    ours = PoM(DIM, DEGREE, EXPAND, sel_heads=sel_heads, bias=bias, rope="2d" if two_d else "1d",
               rope_convention="reference", dtype=F64)
    ours.load_reference_state_dict(ref.state_dict())  # float32 tables, checked and dropped
    return ref.exact_tables(), ours


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


# (2-D PoMRoPE has no default positions: cross_default is 1-D only)
CASES = [(mode, two_d) for mode in ("full", "causal", "padding", "cross", "cross_default") for two_d in (False, True)
         if not (two_d and mode == "cross_default")]


@pytest.mark.parametrize("sel_heads", [1, 4])
@pytest.mark.parametrize("mode,two_d", CASES, ids=[f"{m}-{'2d' if t else '1d'}" for m, t in CASES])
def test_reference_convention_equals_pomrope(mode, two_d, sel_heads):
    """Forward on the torch form and on our float64 oracle, and every gradient, against PoMRoPE's autograd."""
    ref, ours = pair(sel_heads, two_d)
    theirs, kw, x, ctx = case(mode, two_d)
    x = x.clone().requires_grad_(True)
    y_ref = ref(x, **theirs)
    with polymixer.backend("torch"):
        y = ours(x, ctx, **kw)
    assert rel(y, y_ref) <= 1e-9
    with polymixer.backend("reference"):
        assert rel(ours(x, ctx, **kw), y_ref) <= 1e-9
    w = torch.randn_like(y_ref)
    names = {"in_proj.weight": "qc_proj.weight", "gate_bias": "se_bias", "coeff": "po_coeff",
             "out_proj.weight": "ag_proj.weight", "out_proj.bias": "ag_proj.bias"}
    mine = dict(ours.named_parameters())
    grads = torch.autograd.grad((y * w).sum(), [x] + [mine[n] for n in names])
    ref_params = dict(ref.named_parameters())
    expected = torch.autograd.grad((y_ref * w).sum(), [x] + [ref_params[names[n]] for n in names])
    for name, a, b in zip(["x"] + list(names), grads, expected):
        assert rel(a, b) <= 1e-9, name


@pytest.mark.parametrize("sel_heads", [1, 4])
@pytest.mark.parametrize("two_d", [False, True], ids=["1d", "2d"])
def test_reference_convention_streams(two_d, sel_heads):
    """Chunks of a stream (the state keeps Σ R_j f_j; each step turns its gates) == the parallel causal forward."""
    _, ours = pair(sel_heads, two_d)
    x = torch.randn(B, N, DIM, dtype=F64)
    pos = grid(N, 4) if two_d else None
    full = ours(x, causal=True, positions=pos)
    state, out, start = ours.init_state(B, dtype=F64), [], 0
    for size in (1, 5, 3, 4):
        chunk_pos = None if pos is None else pos[start:start + size]
        y, state = ours.step(x[:, start:start + size], state, positions=chunk_pos)
        out.append(y)
        start += size
    assert rel(torch.cat(out, 1), full) <= 1e-12


@pytest.mark.parametrize("two_d", [False, True], ids=["1d", "2d"])
@pytest.mark.parametrize("mode", ["block", "packed"])
def test_block_causal_and_packed_follow_the_oracle(mode, two_d):
    """Modes PoMRoPE does not have, where the convention extends naturally: block-causal and packed sequences (with
    key padding), the torch form against our float64 oracle (each token's position within its sequence)."""
    _, ours = pair(4, two_d)
    x = torch.randn(1, N, DIM, dtype=F64)
    kw = {"positions": grid(N, 5)} if two_d else {}
    if mode == "block":
        kw.update(causal=True, block_size=4)
    else:
        keep = torch.ones(1, N, dtype=torch.bool)
        keep[0, 6] = False
        kw.update(causal=True, cu_seqlens=torch.tensor([0, 5, N], dtype=torch.int32), mask=keep)
    with polymixer.backend("torch"):
        y = ours(x, **kw)
    with polymixer.backend("reference"):
        assert rel(y, ours(x, **kw)) <= 1e-12


def test_the_conventions_differ():
    """Same weights, the other convention: another model (so the comparisons above can fail)."""
    _, ours = pair(1, False)
    x = torch.randn(B, N, DIM, dtype=F64)
    other = PoM(DIM, DEGREE, EXPAND, bias=True, rope="1d", dtype=F64)
    other.load_state_dict(ours.state_dict())
    assert rel(other(x, causal=True), ours(x, causal=True)) > 0.05


# ------------------------------------------------------------------------------------------------------------------
# checkpoints and refusals
# ------------------------------------------------------------------------------------------------------------------


def test_checkpoint_tables_are_checked_and_dropped():
    for two_d in (False, True):
        ref = PoMRoPE64(DIM, DEGREE, EXPAND, 4, rope_2d=two_d)
        sd = ref.state_dict()
        kind = "2d" if two_d else "1d"
        ours = PoM(DIM, DEGREE, EXPAND, sel_heads=4, rope=kind, rope_convention="reference", dtype=F64)
        ours.load_reference_state_dict(sd)
        assert set(ours.reference_state_dict()) == {"qc_proj.weight", "se_bias", "po_coeff", "ag_proj.weight"}
        assert all(torch.equal(ours.reference_state_dict()[k], sd[k]) for k in ours.reference_state_dict())
        first = "row_cos" if two_d else "freqs_cos"
        other_base = PoM(DIM, DEGREE, EXPAND, sel_heads=4, rope=kind, rope_base=500000.0,
                         rope_convention="reference", dtype=F64)
        with pytest.raises(ValueError, match=f"{first} differs from the table of rope_base=500000"):
            other_base.load_reference_state_dict(sd)
        for rope, convention in ((None, "relative"), (kind, "relative"), ("1d" if two_d else "2d", "reference")):
            wrong = PoM(DIM, DEGREE, EXPAND, sel_heads=4, rope=rope, rope_convention=convention, dtype=F64)
            expected = f"loads into PoM\\(..., rope='{kind}', rope_convention='reference'\\)"
            with pytest.raises(ValueError, match=expected):
                wrong.load_reference_state_dict(sd)
        with pytest.raises(ValueError, match=f"{'col_sin' if two_d else 'freqs_sin'} is missing"):
            ours.load_reference_state_dict({k: v for k, v in sd.items() if k not in ("col_sin", "freqs_sin")})


def test_table_tolerance_at_long_range():
    """A 16,384-position float32 table passes; the same table of a base 1% larger does not."""
    ours = PoM(64, 2, 4, rope="1d", rope_convention="reference")  # D = 256
    ref = PoMRoPE64(64, 2, 4, 1)
    sd = {k: v for k, v in ref.state_dict().items() if not k.startswith("freqs")}
    cos, sin = tables_1d(256, 16384, 10000.0, torch.float32)
    ours.load_reference_state_dict({**sd, "freqs_cos": cos, "freqs_sin": sin})
    cos, sin = tables_1d(256, 16384, 10100.0, torch.float32)
    with pytest.raises(ValueError, match="freqs_cos differs"):
        ours.load_reference_state_dict({**sd, "freqs_cos": cos, "freqs_sin": sin})


def test_reference_asserts_are_refused():
    with pytest.raises(ValueError, match="sel_heads must be even .1-D. .*got 1d and 3 heads over 24"):
        PoM(12, rope="1d", sel_heads=3, rope_convention="reference")
    with pytest.raises(ValueError, match="divisible by 4 with heads of ≥ 4 channels .2-D., got 2d and 2 heads over 16"):
        PoM(8, rope="2d", sel_heads=2, rope_convention="reference")
    with pytest.raises(ValueError, match="got 2d and 4 heads over 8"):
        PoM(4, rope="2d", sel_heads=4, rope_convention="reference")  # 2 channels a head
    m = PoM(12, rope="1d", sel_heads=3)
    with pytest.raises(ValueError, match="sel_heads must be even"):
        pom(torch.randn(1, 4, 12), m.weights, rope="1d", rope_convention="reference")
    with pytest.raises(ValueError, match="rope_convention must be 'relative' or 'reference', got 'absolute'"):
        PoM(8, rope="1d", rope_convention="absolute")


def test_value_poms_refuse_the_reference_convention():
    for cls in (ValuePoM, GatedValuePoM):
        with pytest.raises(ValueError, match="one rotary convention, 'relative'"):
            cls(8, rope="1d", rope_convention="reference")
    v = ValuePoM(8, rope="1d")
    with pytest.raises(ValueError, match="value_pom has one rotary convention"):
        value_pom(torch.randn(1, 4, 8), v.weights, rope="1d", rope_convention="reference")


def test_dispatch_says_why():
    """The fused CPU path and the kernels say why they leave the convention to the torch form (context parallelism
    takes it: tests/test_context_parallel.py)."""
    m = PoM(8, rope="1d", rope_convention="reference")
    x = torch.randn(1, 6, 8)
    found = backend_for(x, m.weights, causal=True, rope="1d", rope_convention="reference")
    assert found["backend"] == "torch"
    assert found["passed_over"]["cpu"] == "rope_convention='reference' (PoMRoPE's turned gate) is not fused"
    assert backend_for(x, m.weights, causal=True, rope="1d")["backend"] == "cpu"
    with polymixer.backend("cpu"), pytest.raises(NotImplementedError, match="is not fused"):
        m(x, causal=True)
    call = make_pom_call(x, m.weights, None, dict(causal=True, rope="1d", rope_convention="reference"))
    pytest.importorskip("triton")
    from polymixer.ops.pom import triton_kernels

    assert triton_kernels.kernel_limits(call) == "rope_convention='reference' (PoMRoPE's turned gate) is not in the " \
                                                 "kernels"
