"""One contract per op: every op takes ``(x, weights, context=None, *, state=None, **modes)`` — its weights one typed
object the layer builds (``layer.weights``), the mode keywords one ``Mixing`` with one rotary base (``ROPE_BASE``), a
stream's state in and out through the same op — and validates a call once (``make_*_call``) into the typed ``Call``
every backend gets; the gated form is chosen by the dispatcher like the other ops, and the Triton backends never call
the torch backend."""

from __future__ import annotations

import ast
import inspect
import os
from pathlib import Path

import pytest
import torch

import polymixer
from polymixer import GatedValuePoM, PoM, PoMState, ValuePoM
from polymixer.ops import ROPE_BASE, Mixing, backend, backend_for, dispatch
from polymixer.ops import gated_value_pom as gated
from polymixer.ops import pom as pom_op
from polymixer.ops import value_pom as vp
from polymixer.ops.call import Call
from polymixer.ops.common import MIXING_MODES
from polymixer.ops.value_pom import modular
from polymixer.ops.value_pom.call import make_value_call

OPS = Path(polymixer.__file__).parent / "ops"


def _value(**kw) -> ValuePoM:
    torch.manual_seed(0)
    return ValuePoM(8, value_dim=8, heads=2, **kw)


def _gated() -> GatedValuePoM:
    torch.manual_seed(0)
    m = GatedValuePoM(8, value_dim=8, heads=2, chunk_size=16)
    with torch.no_grad():
        m.decay_proj.weight.normal_(0, 0.5)
    return m


# -- one signature per op: typed weights, state in and state out ---------------------------------------------------


LAYERS = {"pom": lambda: PoM(8, degree=3, rope="1d"), "value_pom": lambda: ValuePoM(8, value_dim=8, heads=2,
                                                                                      token_shift=3, rope="1d"),
          "gated_value_pom": lambda: GatedValuePoM(8, value_dim=8, heads=2, rope="1d")}


@pytest.mark.parametrize("op", list(LAYERS))
def test_the_layer_passes_its_weights_whole_to_its_op(op, monkeypatch):
    """Each layer builds one object of its op's weights type, its fields named after what they hold, and hands it
    to its op — for the forward and for streaming alike."""
    torch.manual_seed(0)
    m = LAYERS[op]().double()
    module = {"pom": pom_op, "value_pom": vp, "gated_value_pom": gated}[op]
    kind = {"pom": pom_op.PomWeights, "value_pom": vp.ValuePomWeights, "gated_value_pom": gated.GatedValuePomWeights}
    assert type(m.weights) is kind[op] and m.weights.in_weight is m.in_proj.weight
    assert m.weights.out_weight is m.out_proj.weight and m.weights.coeff is m.coeff
    assert type(m).op is getattr(module, op)
    seen = []
    real = type(m).op
    monkeypatch.setattr(type(m), "op", staticmethod(lambda x, w, *a, **kw: seen.append(w) or real(x, w, *a, **kw)))
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    m(x, causal=True)
    m.step(x, m.init_state(2, dtype=torch.float64))
    assert [type(w) for w in seen] == [kind[op]] * 2


@pytest.mark.parametrize("op", list(LAYERS))
def test_a_state_in_state_out_call_equals_the_parallel_call_split_into_chunks(op):
    """The op itself, given a state, continues a stream: chunks of any sizes (key padding too) reproduce the
    parallel causal call, output and the count and offset the state carries."""
    torch.manual_seed(1)
    m = LAYERS[op]().double()
    fn = type(m).op
    kw = {} if op == "pom" else dict(heads=2, chunk=m.chunk_size)
    kw.update(activation=m.activation, gate=m.gate, reduction=m.reduction, rope=m.rope)
    x = torch.randn(2, 13, 8, dtype=torch.float64)
    mask = torch.rand(2, 13) > 0.3
    whole = fn(x, m.weights, causal=True, mask=mask, **kw)
    state, ys = m.init_state(2, dtype=torch.float64), []
    for a, b in ((0, 4), (4, 5), (5, 13)):
        y, state = fn(x[:, a:b], m.weights, state=state, causal=True, mask=mask[:, a:b], **kw)
        assert isinstance(state, PoMState)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys, 1), whole, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state.count, mask.sum(1).double())
    assert state.offset.tolist() == [13, 13]


def test_a_wrong_weights_type_gets_a_one_line_error():
    x = torch.randn(1, 4, 8)
    v, g, p = _value(), _gated(), PoM(8)
    for fn, weights, want in ((pom_op.pom, v.weights, "PomWeights"), (vp.value_pom, g.weights, "ValuePomWeights"),
                              (gated.gated_value_pom, v.weights, "GatedValuePomWeights"),
                              (vp.value_pom, tuple(v.weights), "ValuePomWeights")):
        with pytest.raises(TypeError) as e:
            fn(x, weights, heads=2) if fn is not pom_op.pom else fn(x, weights)
        assert "\n" not in str(e.value) and f"takes its weights as one {want} (a layer's .weights), got" in str(e.value)
    with pytest.raises(TypeError, match="state must be a PoMState .from the layer's init_state., got tuple"):
        pom_op.pom(x, p.weights, state=(torch.zeros(1, 16), torch.zeros(1), torch.zeros(1)))
    with pytest.raises(ValueError, match="a stream .state=…. mixes x after its past, .*: block_size is not one"):
        pom_op.pom(x, p.weights, state=p.init_state(1), causal=True, block_size=2)
    with pytest.raises(ValueError, match="this state belongs to a plain PoM"):
        v.step(x, p.init_state(1))


# -- validated once, before any backend --------------------------------------------------------------------------


@pytest.fixture
def no_backend(monkeypatch):
    """The dispatcher refuses to be asked: a call that reaches it was not refused by its front end."""
    def asked(op, call):
        raise AssertionError(f"the dispatcher was asked for {op}")
    monkeypatch.setattr(dispatch, "choose", asked)


def test_a_bad_call_is_refused_at_make_value_call_with_todays_messages(no_backend):
    m = _value()
    w = m.weights
    x = torch.randn(2, 5, 8)
    bad_in = w._replace(in_weight=torch.zeros(3, 8))
    with pytest.raises(ValueError, match=r"in_weight of shape \(3, 8\) does not stack W_k \(16\), W_v \(8\)"):
        make_value_call(x, bad_in, None, {}, heads=2)
    with pytest.raises(ValueError, match=r"in_weight of shape \(3, 8\) does not stack"):
        vp.value_pom(x, bad_in, heads=2)  # the same message from the op, no backend asked
    with pytest.raises(ValueError, match=r"gate_bias has shape \(3,\), in_weight a gate of 8 rows"):
        vp.value_pom(x, w._replace(gate_bias=torch.zeros(3)), heads=2)
    with pytest.raises(ValueError, match="heads = 3 must divide D = 16 and value_dim = 8"):
        vp.value_pom(x, w, heads=3)
    with pytest.raises(ValueError, match="rope must be None, '1d' or '2d', got '3d'"):
        vp.value_pom(x, w, heads=2, rope="3d")
    with pytest.raises(ValueError, match=r"2d rotary needs a key width per head \(D/heads = 2\) divisible by 4"):
        vp.value_pom(x, w, heads=8, rope="2d")
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum', got 'max'"):
        vp.value_pom(x, w, heads=2, reduction="max")
    with pytest.raises(ValueError, match="mask for batch 2, 5 queries, 5 context tokens must have shape"):
        vp.value_pom(x, w, heads=2, mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="chunk must be a positive int, got 0"):
        vp.value_pom(x, w, heads=2, chunk=0)
    state = PoMState(torch.zeros(1, 2, 8, 4), torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.zeros(2, 1, 24))
    with pytest.raises(ValueError, match=r"state has shape \(1, 2, 8, 4\)"):
        vp.value_pom(x, w, heads=2, state=state)


def test_every_backend_receives_the_validated_typed_call(monkeypatch):
    """A 2-D packed input arrives batched, the mask split into key padding, the mode as one Mixing with the one
    rotary base; the packed output goes back 2-D."""
    seen = []
    real = modular.forward
    monkeypatch.setattr(modular, "forward", lambda call: seen.append(call) or real(call))
    m = _value(rope="1d")
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    with backend("torch"):
        y = vp.value_pom(torch.randn(7, 8), m.weights, heads=2, causal=True, cu_seqlens=cu, rope="1d",
                         mask=torch.ones(1, 7, dtype=torch.bool))
    (call,) = seen
    assert isinstance(call, Call) and isinstance(call.mixing, Mixing) and call.weights is not None
    assert call.x.shape == (1, 7, 8) and call.squeeze and y.shape == (7, 8)
    assert call.key_mask is not None and call.mask is None and call.cu_k is cu and call.state is None
    assert (call.B, call.M, call.N, call.D, call.dv, call.heads) == (1, 7, 7, 16, 8, 2)
    assert call.mixing.rope_base == ROPE_BASE and call.mixing.causal


def test_the_mode_keywords_live_in_one_object_with_one_rotary_base():
    with pytest.raises(ValueError, match="rope must be None, '1d' or '2d', got 'x'"):
        Mixing(rope="x").check()
    with pytest.raises(ValueError, match="unknown gate 'nope'"):
        Mixing(gate="nope").check()
    assert Mixing().rope_base == ROPE_BASE == 10000.0
    from polymixer import reference

    for fn in (pom_op.pom, pom_op.backend_for, vp.value_pom, vp.backend_for, gated.gated_value_pom,
               gated.backend_for, reference.reference_pom, reference.reference_value_pom):
        # the ops read their mode keywords into one Mixing: no op spells them (or their defaults) out again
        params = inspect.signature(fn).parameters
        assert "modes" in params and not set(params) & set(MIXING_MODES), fn.__qualname__
        assert list(params)[:2] == ["x", "weights"], fn.__qualname__
    assert Mixing.of("pom", {"causal": True, "rope_base": 500}).rope_base == 500.0
    with pytest.raises(TypeError, match="pom.. got an unexpected keyword argument 'casual'"):
        pom_op.pom(torch.randn(1, 3, 4), PoM(4).weights, casual=True)
    literal = [f"{p.relative_to(OPS)}:{i}" for p in sorted(OPS.rglob("*.py"))
               for i, line in enumerate(p.read_text().splitlines(), 1)
               if "10000.0" in line and "ROPE_BASE = 10000.0" not in line]
    assert not literal, f"the rotary base written out instead of ROPE_BASE: {literal}"


# -- the gated form through the dispatcher ------------------------------------------------------------------------


def test_backend_for_names_the_gated_backend_and_the_reasons():
    m = _gated()
    x = torch.randn(2, 9, 8)
    got = backend_for("gated_value_pom", x, m.weights, heads=2, causal=True, chunk=16)
    assert got["backend"] == "torch" and not got["explicit"]
    assert "CUDA tensors only" in got["passed_over"]["triton"]
    assert got["passed_over"]["cpu"].startswith("no fused CPU form")  # an op without a backend says why
    with backend("torch"):
        assert backend_for("gated_value_pom", x, m.weights, heads=2)["explicit"]
    with pytest.raises(ValueError, match="cross-mixing is not supported"):  # validated before any backend
        backend_for("gated_value_pom", x, m.weights, x, heads=2)


@pytest.mark.parametrize("kw", [dict(causal=True), dict(), dict(causal=True, block_size=3)],
                         ids=["causal", "full", "block 3"])
def test_the_gated_reference_backend_is_the_oracle(kw):
    """backend("reference") runs the gated op on its float64 oracle: the torch backend agrees in float64 (key
    padding and rotary included); packed calls are refused with the reason."""
    m = _gated().double()
    x = torch.randn(2, 11, 8, dtype=torch.float64)
    mask = torch.rand(2, 11) > 0.3
    mask[:, 0] = True
    with backend("reference"):
        ref = gated.gated_value_pom(x, m.weights, heads=2, mask=mask, rope="1d", **kw)
    with backend("torch"):
        y = gated.gated_value_pom(x, m.weights, heads=2, mask=mask, rope="1d", **kw)
    torch.testing.assert_close(y, ref, rtol=1e-9, atol=1e-10)
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    with backend("reference"), pytest.raises(NotImplementedError, match="packed sequences .* not in the oracle"):
        gated.gated_value_pom(x[:1], m.weights, heads=2, cu_seqlens=cu, **kw)


def test_a_strict_triton_choice_for_the_gated_op_on_cpu_raises_why(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    m = _gated()
    x = torch.randn(1, 9, 8)
    with backend("triton"), pytest.raises(NotImplementedError, match="backend 'triton' cannot take this "
                                                                     "gated_value_pom call: CUDA tensors only"):
        m(x, causal=True)
    with backend("cpu"), pytest.raises(NotImplementedError, match=r"backend 'cpu' has no gated_value_pom \(no fused "
                                                                  r"CPU form: the torch form's chunked scan"):
        m(x, causal=True)
    with backend("reference"), pytest.raises(NotImplementedError, match="a stream .state=…. runs on the torch form"):
        m.step(x[:, :3], m.init_state(1))
    with backend("torch"):  # streams run on the torch form
        state = m.init_state(1)
        m.step(x[:, :3], state)


def test_the_gated_triton_backend_refuses_what_its_kernels_cannot_take():
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("CPU tensors need TRITON_INTERPRET=1")
    from polymixer.ops.gated_value_pom import triton_kernels as gated_triton

    m = _gated()
    x = torch.randn(1, 9, 8)
    from polymixer.ops.gated_value_pom.call import make_gated_call

    call = make_gated_call(x, m.weights, None, dict(causal=True), heads=2, chunk=12)
    assert "a chunk of 12 tokens" in gated_triton.supports(call)
    assert gated_triton.supports(make_gated_call(x.double(), m.weights, None, {}, heads=2, chunk=16)) is not None
    assert gated_triton.supports(make_gated_call(x, m.weights, None, {}, heads=2, chunk=16)) is None


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
                assert backend_for("gated_value_pom", x, m.weights, heads=2, chunk=16, **kw,
                                   **extra)["backend"] == "triton"
                y = gated.gated_value_pom(x, m.weights, heads=2, chunk=16, **kw, **extra)
            with backend("torch"):
                ref = gated.gated_value_pom(x, m.weights, heads=2, chunk=16, **kw, **extra)
        torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)


# -- no backend calls another -------------------------------------------------------------------------------------


def _references(path: Path) -> set:
    """Every module a file imports (relative names as written) and every
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
