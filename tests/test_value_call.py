"""One front end per op: the value PoM's call is typed and validated once (``make_value_call``), every backend gets
that call, the gated form is chosen by the dispatcher like the other ops, the Triton backends never call the torch
backend, and the mode keywords live in one object (``Mixing``) with one rotary base (``ROPE_BASE``)."""

from __future__ import annotations

import ast
import inspect
import os
from pathlib import Path

import pytest
import torch

import polymixer
from polymixer import PoM
from polymixer.ops import ROPE_BASE, Mixing, backend, backend_for, dispatch
from polymixer.ops.common import MIXING_MODES, STEP_MODES
from polymixer.ops import value_pom as vp
from polymixer.ops import gated_value_pom as gated
from polymixer.ops.value_pom import modular

OPS = Path(polymixer.__file__).parent / "ops"


def _value(**kw) -> PoM:
    torch.manual_seed(0)
    return PoM(8, value_dim=8, heads=2, **kw)


def _gated() -> PoM:
    torch.manual_seed(0)
    m = PoM(8, value_dim=8, heads=2, decay="head", chunk_size=16)
    with torch.no_grad():
        m.decay_proj.weight.normal_(0, 0.5)
    return m


def _gated_args(m: PoM, x: torch.Tensor) -> tuple:
    return (x, None, *m.value_weights(), m.decay_proj.weight, m.decay_proj.bias)


# -- validated once, before any backend --------------------------------------------------------------------------


@pytest.fixture
def no_backend(monkeypatch):
    """The dispatcher refuses to be asked: a call that reaches it was not refused by its front end."""
    def asked(op, call):
        raise AssertionError(f"the dispatcher was asked for {op}")
    monkeypatch.setattr(dispatch, "choose", asked)


def test_a_bad_call_is_refused_at_make_value_call_with_todays_messages(no_backend):
    m = _value()
    w = list(m.value_weights())
    x = torch.randn(2, 5, 8)
    bad_in = [torch.zeros(3, 8)] + w[1:]
    with pytest.raises(ValueError, match=r"in_weight of shape \(3, 8\) does not stack W_k \(16\), W_v \(8\)"):
        vp.value_call(x, None, *bad_in, heads=2)
    with pytest.raises(ValueError, match=r"in_weight of shape \(3, 8\) does not stack"):
        vp.value_pom(x, None, *bad_in, heads=2)  # the same message from the op, no backend asked
    with pytest.raises(ValueError, match="heads = 3 must divide D = 16 and value_dim = 8"):
        vp.value_pom(x, None, *w, heads=3)
    with pytest.raises(ValueError, match="rope must be None, '1d' or '2d', got '3d'"):
        vp.value_pom(x, None, *w, heads=2, rope="3d")
    with pytest.raises(ValueError, match=r"2d rotary needs a key width per head \(D/heads = 2\) divisible by 4"):
        vp.value_pom(x, None, *w, heads=8, rope="2d")
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum', got 'max'"):
        vp.value_pom(x, None, *w, heads=2, reduction="max")
    with pytest.raises(ValueError, match="mask for batch 2, 5 queries, 5 context tokens must have shape"):
        vp.value_pom(x, None, *w, heads=2, mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="chunk must be a positive int, got 0"):
        vp.value_pom(x, None, *w, heads=2, chunk=0)
    with pytest.raises(ValueError, match=r"state has shape \(1, 2, 8, 4\)"):
        vp.value_pom_step(x, torch.zeros(1, 2, 8, 4), torch.zeros(2), torch.zeros(2, dtype=torch.long),
                          torch.zeros(2, 1, 24), *w, heads=2)


def test_every_backend_receives_the_validated_typed_call(monkeypatch):
    """A 2-D packed input arrives batched, the mask split into key padding, the mode as one Mixing with the one
    rotary base; the packed output goes back 2-D."""
    seen = []
    real = modular.forward
    monkeypatch.setattr(modular, "forward", lambda call: seen.append(call) or real(call))
    m = _value(rope="1d")
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    with backend("torch"):
        y = vp.value_pom(torch.randn(7, 8), None, *m.value_weights(), heads=2, causal=True, cu_seqlens=cu,
                         rope="1d", mask=torch.ones(1, 7, dtype=torch.bool))
    (call,) = seen
    assert isinstance(call, vp.ValueCall) and isinstance(call.mixing, Mixing)
    assert call.x.shape == (1, 7, 8) and call.squeeze and y.shape == (7, 8)
    assert call.key_mask is not None and call.mask is None and call.cu_k is cu
    assert (call.B, call.M, call.N, call.D, call.dv, call.heads) == (1, 7, 7, 16, 8, 2)
    assert call.mixing.rope_base == ROPE_BASE and call.mixing.causal


def test_the_mode_keywords_live_in_one_object_with_one_rotary_base():
    with pytest.raises(ValueError, match="rope must be None, '1d' or '2d', got 'x'"):
        Mixing(rope="x").check()
    with pytest.raises(ValueError, match="unknown gate 'nope'"):
        Mixing(gate="nope").check()
    assert Mixing().rope_base == ROPE_BASE == 10000.0 and Mixing(causal=True, block_size=4).mode() == "block-causal"
    from polymixer.ops import pom, reference

    for fn in (pom.pom, pom.pom_step, pom.make_call, vp.value_pom, vp.value_pom_step, vp.value_call,
               gated.gated_value_pom, gated.gated_value_pom_step, gated.gated_call, reference.reference_pom,
               reference.reference_value_pom):
        # the ops read their mode keywords into one Mixing: no op spells them (or their defaults) out again
        params = inspect.signature(fn).parameters
        assert "modes" in params and not set(params) & set(MIXING_MODES), fn.__qualname__
    assert Mixing.of("pom", {"causal": True, "rope_base": 500}).rope_base == 500.0
    assert Mixing.of("pom_step", {}, STEP_MODES, causal=True).causal
    with pytest.raises(TypeError, match="pom_step.. got an unexpected keyword argument .block_size.; its modes?"):
        Mixing.of("pom_step", {"block_size": 4}, STEP_MODES)
    with pytest.raises(TypeError, match="pom.. got an unexpected keyword argument 'casual'"):
        pom.pom(torch.randn(1, 3, 4), None, torch.randn(16, 4), torch.zeros(8), torch.zeros(8, 2),
                torch.randn(4, 8), casual=True)
    literal = [f"{p.relative_to(OPS)}:{i}" for p in sorted(OPS.rglob("*.py"))
               for i, line in enumerate(p.read_text().splitlines(), 1)
               if "10000.0" in line and "ROPE_BASE = 10000.0" not in line]
    assert not literal, f"the rotary base written out instead of ROPE_BASE: {literal}"


# -- the gated form through the dispatcher ------------------------------------------------------------------------


def test_backend_for_names_the_gated_backend_and_the_reasons():
    m = _gated()
    x = torch.randn(2, 9, 8)
    got = backend_for("gated_value_pom", *_gated_args(m, x), heads=2, causal=True, chunk=16)
    assert got["backend"] == "torch" and not got["explicit"]
    assert "CUDA tensors only" in got["passed_over"]["triton"]
    with backend("torch"):
        assert backend_for("gated_value_pom", *_gated_args(m, x), heads=2)["explicit"]
    with pytest.raises(ValueError, match="cross-mixing is not supported"):  # validated before any backend
        backend_for("gated_value_pom", x, x, *_gated_args(m, x)[2:], heads=2)


@pytest.mark.parametrize("kw", [dict(causal=True), dict(), dict(causal=True, block_size=3)],
                         ids=["causal", "full", "block 3"])
def test_the_gated_reference_backend_is_the_oracle(kw):
    """backend("reference") runs the gated op on its float64 oracle: the torch backend agrees in float64 (key
    padding and rotary included); packed calls are refused with the reason."""
    m = _gated().double()
    x = torch.randn(2, 11, 8, dtype=torch.float64)
    mask = torch.rand(2, 11) > 0.3
    mask[:, 0] = True
    args = _gated_args(m, x)
    with backend("reference"):
        ref = gated.gated_value_pom(*args, heads=2, mask=mask, rope="1d", **kw)
    with backend("torch"):
        y = gated.gated_value_pom(*args, heads=2, mask=mask, rope="1d", **kw)
    torch.testing.assert_close(y, ref, rtol=1e-9, atol=1e-10)
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    with backend("reference"), pytest.raises(NotImplementedError, match="packed sequences .* not in the oracle"):
        gated.gated_value_pom(x[:1], *args[1:], heads=2, cu_seqlens=cu, **kw)


def test_a_strict_triton_choice_for_the_gated_op_on_cpu_raises_why(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    m = _gated()
    x = torch.randn(1, 9, 8)
    with backend("triton"), pytest.raises(NotImplementedError, match="backend 'triton' cannot take this "
                                                                     "gated_value_pom call: CUDA tensors only"):
        m(x, causal=True)
    with backend("cpu"), pytest.raises(NotImplementedError, match="backend 'cpu' has no gated_value_pom"):
        m(x, causal=True)
    with backend("torch"):  # the streaming step has the torch form
        state = m.init_state(1)
        m.step(x[:, :3], state)


def test_the_gated_triton_backend_refuses_what_its_kernels_cannot_take():
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("CPU tensors need TRITON_INTERPRET=1")
    from polymixer.ops.gated_value_pom import triton_kernels as gated_triton

    m = _gated()
    x = torch.randn(1, 9, 8)
    call = gated.gated_call(*_gated_args(m, x), heads=2, causal=True, chunk=12)
    assert "a chunk of 12 tokens" in gated_triton.supports(call)
    assert gated_triton.supports(gated.gated_call(*_gated_args(m, x.double()), heads=2, chunk=16)) is not None
    assert gated_triton.supports(gated.gated_call(*_gated_args(m, x), heads=2, chunk=16)) is None


@pytest.mark.parametrize("kw", [dict(causal=True), dict(), dict(causal=True, block_size=3)],
                         ids=["causal", "full", "block 3"])
def test_the_gated_triton_backend_matches_the_torch_one(kw):
    """A strict backend("triton") runs the gated op on the kernels (Triton's interpreter on CPU tensors) through
    the shared features and readout: the same output as the torch backend, packed sequences too."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("CPU tensors need TRITON_INTERPRET=1")
    m = _gated()
    x = torch.randn(1, 21, 8)
    cu = torch.tensor([0, 5, 21], dtype=torch.int32)
    for extra in (dict(), dict(cu_seqlens=cu)):
        with torch.no_grad():
            with backend("triton"):
                assert backend_for("gated_value_pom", *_gated_args(m, x), heads=2, chunk=16, **kw,
                                   **extra)["backend"] == "triton"
                y = gated.gated_value_pom(*_gated_args(m, x), heads=2, chunk=16, **kw, **extra)
            with backend("torch"):
                ref = gated.gated_value_pom(*_gated_args(m, x), heads=2, chunk=16, **kw, **extra)
        torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)


# -- no backend calls another -------------------------------------------------------------------------------------


def _references(path: Path) -> set:
    """Every module a file imports (relative names resolved within polymixer.ops.value_pom) and every
    ``name.attribute`` it reads."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            out.add(base)
            out.update(f"{base}.{a.name}" if node.module else f"{base}{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            out.add(f"{node.value.id}.{node.attr}")
    return out


@pytest.mark.parametrize("op", ["value_pom", "gated_value_pom"])
def test_a_triton_backend_never_imports_or_calls_the_torch_backend(op):
    kernels, torch_form = "triton_kernels.py", "modular"
    refs = _references(OPS / op / kernels)
    touching = sorted(r for r in refs if torch_form in r.split(".") or r.startswith(f".{torch_form}"))
    assert not touching, f"{kernels} reaches the torch backend: {touching}"
    assert not {f"{torch_form}.forward", f"{torch_form}.value_pom", "modular.value_pom"} & refs
    assert any(r.split(".")[-1] == "features" for r in refs)  # what it shares with the torch form: the shared module
