"""The kernels as PyTorch custom ops: ``torch.compile(fullgraph=True)`` keeps them (a strict ``backend("triton")``
inside the compiled region runs them), ``torch.export`` keeps them, and no forward or backward reads a value back to
the host (CUDA-graph capturable).

On CPU the kernels run in Triton's interpreter (conftest.py sets ``TRITON_INTERPRET=1``); with
``POLYMIXER_TEST_DEVICE=cuda`` they run compiled, and the GPU-only test checks ``set_sync_debug_mode("error")``."""

from __future__ import annotations

from typing import Any, Callable, List

import pytest
import torch

pytest.importorskip("triton")

from polymixer import PoM, PolyMorpher, ValuePoM  # noqa: E402
from polymixer.ops import backend  # noqa: E402
from polymixer.ops import triton_common as tc  # noqa: E402
from polymixer.ops.pom import triton_kernels as tk  # noqa: E402
from polymixer.ops.value_pom import triton_kernels as vk  # noqa: E402

SLOW = pytest.mark.slow
CU = torch.tensor([0, 5, 6, 17, 21], dtype=torch.int32)


@pytest.fixture(autouse=True)
def small_tiles(device, monkeypatch):
    if device.type == "cpu" and not tc.interpreted():
        pytest.skip("CPU tensors need TRITON_INTERPRET=1 (conftest.py sets it unless POLYMIXER_TEST_DEVICE=cuda)")
    tk.use_config(tk.LaunchConfig(8, 8, 1, 16))
    monkeypatch.setattr(vk, "CHUNK", 16)
    torch._dynamo.reset()
    yield
    tk.use_config(None)
    torch._dynamo.reset()


def _mixer(value: bool = False, **kw) -> PoM:
    m = (ValuePoM(8, heads=2, degree=3, expand=2, bias=True, **kw) if value
         else PoM(8, degree=3, expand=2, bias=True, **kw))
    with torch.no_grad():
        m.coeff.uniform_(-1.0, 1.0)
        m.gate_bias.normal_()
        if value:
            m.coeff_q.uniform_(-1.0, 1.0)
    return m


MODES = {
    "full": (2, {}),
    "causal": (2, dict(causal=True)),
    "block-causal": (2, dict(causal=True, block_size=3)),
    "key padding": (2, dict(causal=True, mask=torch.rand(2, 21) > 0.3)),
    "packed causal": (1, dict(causal=True, cu_seqlens=CU)),
    "packed full": (1, dict(cu_seqlens=CU)),
    "packed block-causal": (1, dict(causal=True, block_size=3, cu_seqlens=CU, mask=torch.rand(1, 21) > 0.2)),
    "rotary": (2, dict(causal=True)),
}
DEFAULT = {("pom", "packed block-causal"), ("value_pom", "packed full")}


class _Recorder:
    """A torch.compile backend that remembers the custom ops of every graph dynamo hands it, then runs aot_eager."""

    def __init__(self) -> None:
        self.ops: List[str] = []
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, inputs: Any) -> Callable[..., Any]:
        self.graphs += 1
        self.ops += [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "polymixer" in str(n.target)]
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)


def _grads(fn: Callable[..., torch.Tensor], m: PoM, x: torch.Tensor, kw: dict) -> list:
    m.zero_grad()
    x = x.detach().clone().requires_grad_()
    y = fn(x, **kw)
    y.square().sum().backward()
    return [y.detach(), x.grad] + [p.grad.clone() for p in m.parameters() if p.grad is not None]


@pytest.mark.parametrize("op, mode", [pytest.param(op, mode, marks=() if (op, mode) in DEFAULT else SLOW)
                                      for op in ("pom", "value_pom") for mode in MODES])
@pytest.mark.usefixtures("traced_kernels")
def test_compiled_fullgraph_keeps_the_kernels(op, mode, device):
    """Every self-mixing mode of PoM and the value PoM under torch.compile(fullgraph=True) with a strict
    backend("triton") inside: one graph, the custom op in it (the value PoM's full mixing of whole rows is two
    cuBLAS products), forward and gradients within 1e-5 of eager (max error ÷ max value)."""
    B, kw = MODES[mode]
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    m = _mixer(value=op == "value_pom", rope="1d" if mode == "rotary" else None).to(device)
    x = torch.randn(B, 21, 8, device=device)

    def f(x, **kw):
        with backend("triton"):
            return m(x, **kw)

    want = _grads(f, m, x, kw)
    rec = _Recorder()
    got = _grads(torch.compile(f, fullgraph=True, backend=rec), m, x, kw)
    kernel = "pom_mix" if op == "pom" else "value_mix"
    if op == "value_pom" and mode == "full":  # whole rows mix as two cuBLAS products: no kernel, still one graph
        assert rec.graphs == 1 and not rec.ops, rec.ops
    else:
        assert rec.graphs == 1 and any(kernel in o for o in rec.ops), rec.ops
    for a, b in zip(got, want):
        err = (a - b).abs().max().item() / (b.abs().max().item() + 1e-30)
        assert err <= 1e-5, err


@pytest.mark.parametrize("op", ["pom", pytest.param("value_pom", marks=SLOW)])
@pytest.mark.usefixtures("traced_kernels")
def test_inductor_compiles_around_the_kernels(op, device):
    m = _mixer(value=op == "value_pom").to(device)
    x = torch.randn(2, 21, 8, device=device)

    def f(x, causal):
        with backend("triton"):
            return m(x, causal=causal)

    want = _grads(f, m, x, dict(causal=True))
    got = _grads(torch.compile(f, fullgraph=True, backend="inductor"), m, x, dict(causal=True))
    for a, b in zip(got, want):  # inductor compiles the torch parts around the kernels: its own rounding
        assert (a - b).abs().max().item() <= 1e-5 * b.abs().max().item()


@pytest.mark.usefixtures("traced_kernels")
def test_the_fused_route_compiles_too(device):
    m = _mixer().to(device)
    x = torch.randn(1, 21, 8, device=device)

    def f(x, **kw):
        with backend("triton_gemm"):
            return m(x, **kw)

    kw = dict(causal=True, cu_seqlens=CU.to(device))
    want = _grads(f, m, x, kw)
    rec = _Recorder()
    got = _grads(torch.compile(f, fullgraph=True, backend=rec), m, x, kw)
    assert any("pom_gemm" in o for o in rec.ops), rec.ops
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("traced_kernels")
def test_torch_export_keeps_the_kernels(device):
    """A model with PoM layers exports with the kernels as one custom op per layer, and the exported program runs
    them."""
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([PolyMorpher(16, "pom", degree=2), PolyMorpher(16, "pom", degree=2)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with backend("triton"):
                for b in self.blocks:
                    x = b(x, causal=True)
            return x

    model = Model().to(device).eval()
    x = torch.randn(2, 21, 16, device=device)
    ep = torch.export.export(model, (x,))
    ops = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert sum("polymixer.pom_mix" in o for o in ops) == 2, ops
    torch.testing.assert_close(ep.module()(x), model(x), rtol=1e-5, atol=1e-6)


# -- no host synchronisation --------------------------------------------------------------------------------------


@pytest.fixture
def no_launch(monkeypatch):
    """Kernel launches that do nothing: the host side of an op then runs on meta tensors, which hold no values —
    reading one back to the host (``.item()``, ``int(t)``, ``.tolist()``, a data-dependent shape) raises."""
    launched: List[str] = []
    stub = lambda kernel, grid, *a, **k: launched.append(kernel.__name__)  # noqa: E731
    monkeypatch.setattr(tk, "launch", stub)
    monkeypatch.setattr(vk, "launch", stub)
    return launched


@pytest.mark.parametrize("mode", list(MODES))
def test_the_host_side_reads_nothing_back(mode, no_launch):
    """The whole host side of both ops — call checks, layout, sequence ids, table sizes, the ops' bodies forward
    and backward on both routes, programs of several chunks included, and the value PoM's packed modes in place — on
    meta tensors: reading any value back to the host would raise, so nothing synchronises."""
    from polymixer.ops.pom.call import PomWeights, make_pom_call
    from polymixer.ops.value_pom.call import make_value_call

    B, kw = MODES[mode]
    meta = lambda t: None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta")  # noqa: E731
    pom, value = _mixer(rope="1d" if mode == "rotary" else None), _mixer(value=True)
    kwm = {k: (meta(v) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    x = torch.empty(B, 21, 8, device="meta")
    w_in, bias, coeff, w_out = (meta(t) for t in (pom.in_proj.weight, pom.gate_bias, pom.coeff, pom.out_proj.weight))
    for per_program in (None, 3):
        tk.use_config(tk.LaunchConfig(8, 8, 1, 16, chunks_per_program=per_program))
        call = make_pom_call(x, PomWeights(w_in, bias, coeff, w_out), None, dict(rope=pom.rope, **kwm))
        args = tk.mix_args(call, call.N)
        z = torch.empty(B, 21, call.D + call.Ds, device="meta")
        for fused in (False, True):
            src = (None, x, w_in) if fused else (z, None, None)
            g, *saved = tk.mix(*src, coeff, bias, *args)
            tk.mix_backward(torch.empty_like(g), *src, coeff, bias, *args[:4], tk.Saved(*saved), *args[4:])
        weights = type(value.weights)(*(meta(t) for t in value.weights))
        vk.forward(make_value_call(x, weights, None, kwm, heads=2))
    want = {"_sums_kernel", "_scan_kernel", "_apply_kernel", "_grad_sums_kernel", "_grad_apply_kernel"}
    assert want <= set(no_launch), set(no_launch)


def test_the_value_mixing_reads_nothing_back(no_launch):
    q, k, v = (torch.empty(1, 2, 37, 4, device="meta") for _ in range(3))
    cu = torch.empty(5, dtype=torch.int32, device="meta")
    seqid = torch.empty(37, dtype=torch.int32, device="meta")
    for mode in (0, 1, 2):
        o = vk._mix(q, k, v, cu, seqid, mode, 3)
        vk._mix_backward(torch.empty_like(o), q, k, v, cu, seqid, mode, 3)
    assert {"_states_kernel", "_output_kernel", "_dstates_kernel", "_dv_kernel", "_dqk_kernel"} <= set(no_launch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_no_synchronisation_on_a_gpu():
    """On a GPU: forward and backward of both ops in every mode under ``set_sync_debug_mode("error")``."""
    tk.use_config(None)
    dev = torch.device("cuda")
    for value in (False, True):
        m = _mixer(value=value).to(dev)
        for mode, (B, kw) in MODES.items():
            kw = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
            x = torch.randn(B, 21, 8, device=dev, requires_grad=True)
            with backend("triton"):
                m(x, **kw).sum().backward()  # first use: the checks run (they may synchronise)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                with backend("triton"):
                    m(x, **kw).sum().backward()
            finally:
                torch.cuda.set_sync_debug_mode(0)


def test_the_first_use_check_runs_clean_inside_torch_export(monkeypatch):
    """A first-use check met while torch.export traces (a model's first call of the kernels) runs outside the trace,
    in a thread of its own: with torch 2.11 the tracer refused the check's ``torch.Generator`` ("argument of type
    Generator"), the check failed, and every later call of that process fell back to the torch form."""
    monkeypatch.setattr(tc, "CHECKED", {})
    seen = []

    def check(device: torch.device, dtype: torch.dtype) -> None:
        gen = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(4, 4, generator=gen).to(device).requires_grad_()
        (a * 2).sum().backward()
        seen.append((type(a).__name__, torch.is_grad_enabled(), a.grad is not None))

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            why = tc.first_use("probe", x.device, torch.float32, check)
            return x * 2 if why is None else x * 3

    ep = torch.export.export(Model(), (torch.randn(3),))
    assert tc.CHECKED == {("probe", "cpu", None, torch.float32): None}
    assert seen == [("Tensor", True, True)]
    x = torch.randn(3)
    torch.testing.assert_close(ep.module()(x), x * 2)
