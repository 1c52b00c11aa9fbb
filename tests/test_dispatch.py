"""One op, several backends: the dispatcher's automatic choice, the strict explicit choice, what it says about
both, and the public names kept where users import them."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import polymixer
from polymixer import PoM, ValuePoM, functional
from polymixer.ops import BACKENDS, backend, backend_for, current_backend, disabled_backends


def _args(m: PoM, x: torch.Tensor):
    return (x, m.weights)


def test_the_automatic_choice_and_its_reasons():
    m = PoM(8)
    x = torch.randn(2, 5, 8)
    plain = backend_for("pom", *_args(m, x), causal=True)
    assert plain["backend"] == "cpu" and not plain["explicit"] and "CUDA tensors only" in plain["passed_over"]["triton"]
    padded = backend_for("pom", *_args(m, x), causal=True, mask=torch.ones(2, 5, dtype=torch.bool))
    assert padded["backend"] == "torch" and padded["passed_over"]["cpu"] == "key padding is not fused"
    with disabled_backends("cpu"):
        assert backend_for("pom", *_args(m, x))["passed_over"]["cpu"] == "switched off"
    with functional.fused_kernels(False):  # the older switch does the same
        assert backend_for("pom", *_args(m, x))["backend"] == "torch"
    assert polymixer.backend_for is backend_for
    assert set(BACKENDS) == {"reference", "torch", "cpu", "triton", "triton_gemm"}


def test_an_explicit_choice_is_strict_and_says_why():
    m = PoM(8)
    x = torch.randn(2, 5, 8)
    with backend("cpu"):
        assert current_backend() == "cpu"
        m(x, causal=True)
        with pytest.raises(NotImplementedError, match="backend 'cpu' cannot take this pom call: block-causal "
                                                      "masking is not fused"):
            m(x, causal=True, block_size=2)
        with backend("torch"):  # the innermost block wins
            m(x, causal=True, block_size=2)
    assert current_backend() is None
    v = ValuePoM(8, value_dim=8)
    with backend("cpu"), pytest.raises(NotImplementedError, match=r"backend 'cpu' has no value_pom \(no fused CPU "
                                                                  r"form: the torch form's chunked products"):
        v(x)
    with pytest.raises(ValueError, match="unknown backend 'cuda'; the backends are reference, torch, cpu, triton"):
        with backend("cuda"):
            pass


@pytest.mark.parametrize("op", ["pom", "value_pom"])
def test_every_backend_of_an_op_agrees_with_the_reference_in_float64(op):
    m = (ValuePoM(8, degree=3, bias=True, heads=2) if op == "value_pom" else PoM(8, degree=3, bias=True)).double()
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    for mode in (dict(causal=True), {}, dict(causal=True, block_size=4)):
        with backend("reference"):
            want = m(x, **mode)
        for name in ("torch", "cpu") if op == "pom" else ("torch",):
            if name == "cpu" and "block_size" in mode:
                continue
            with backend(name):
                torch.testing.assert_close(m(x, **mode), want, rtol=1e-10, atol=1e-10)


def test_the_choice_is_logged_at_debug_level(caplog):
    m = PoM(8)
    with caplog.at_level(logging.DEBUG, logger="polymixer.ops"):
        m(torch.randn(1, 4, 8), mask=torch.ones(1, 4, dtype=torch.bool))
    assert any("pom on torch" in r.message and "cpu passed over: key padding is not fused" in r.message
               for r in caplog.records)


def test_the_public_names_stay_where_users_import_them():
    from polymixer import reference, values

    for name in ("pom", "PomWeights", "PoMState", "poly_features", "cumsum", "aggregate", "gate_mix", "rope_angles",
                 "rotate", "check_cu_seqlens", "documents_cu_seqlens", "fused_kernels", "ACTIVATIONS", "GATES"):
        assert hasattr(functional, name), name
    for name in ("value_pom", "ValuePomWeights", "gated_value_pom", "GatedValuePomWeights", "value_mix",
                 "packed_causal_mix", "token_shift", "pad_packed"):
        assert hasattr(values, name), name
    for name in ("visibility", "reference_pom", "reference_value_pom", "reference_gated", "reference_attention",
                 "shift_validity"):
        assert hasattr(reference, name), name


# -- CPU calls, and the Triton backends inside torch.compile from a fresh process ---------------------------------

_ENV = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTEST_XDIST_WORKER")}


def _python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh Python process (one thread, no GPU) and return its output; fail with its stderr."""
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600,
                         env={**_ENV, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **env})
    assert res.returncode == 0, res.stderr[-4000:]
    return res.stdout


def test_cpu_calls_never_import_triton():
    """Without a GPU and without the interpreter, every call of both ops — forward, backward, every mode, and
    backend_for — runs without importing Triton (nor torch's dynamo, which imports it)."""
    out = _python("""
        import sys, torch, polymixer
        from polymixer import PoM, ValuePoM
        m, v = PoM(8), ValuePoM(8, value_dim=8, heads=2)
        x = torch.randn(2, 12, 8)
        for kw in (dict(causal=True), {}, dict(causal=True, block_size=4)):
            m(x, **kw).sum().backward()
            v(x, **kw).sum().backward()
        polymixer.backend_for("pom", x, m.weights)
        polymixer.backend_for("value_pom", x, v.weights, causal=True, heads=2)
        print(sorted(k for k in sys.modules if k == "triton" or k.startswith("triton.")))
    """)
    assert out.strip() == "[]", out


_FRESH_COMPILE = """
    import sys, torch, polymixer
    from polymixer import PoM, ValuePoM

    op = sys.argv[1] if len(sys.argv) > 1 else "{op}"
    assert "polymixer.ops.{module}.triton_kernels" in sys.modules  # imported with the op's package
    m = ValuePoM(8, degree=2, heads=2) if op == "value_pom" else PoM(8, degree=2)
    x = torch.randn(2, 12, 8)
    ops = []

    def recorder(gm, inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)

    def f(x):
        with polymixer.backend("triton"):
            return m(x, causal=True)

    got = torch.compile(f, fullgraph=True, backend=recorder)(x)  # the process's first call of the op
    want = f(x)
    assert any("polymixer.{kernel}" in o for o in ops), ops
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    print("kernels in the graph")
"""


@pytest.mark.parametrize("op", ["pom", "value_pom"])
def test_a_strict_triton_backend_compiles_as_a_fresh_processs_first_call(op):
    """A fresh process (the interpreter on, CPU tensors) whose FIRST call of the op is inside
    torch.compile(fullgraph=True) with a strict backend("triton"): the op's Triton backend was imported with its
    package (dynamo cannot trace an import), so the kernels' custom op is in the one graph and the result is
    eager's."""
    pytest.importorskip("triton")
    kernel = {"pom": "pom_mix", "value_pom": "value_mix"}[op]
    out = _python(_FRESH_COMPILE.format(op=op, module=op, kernel=kernel), TRITON_INTERPRET="1")
    assert "kernels in the graph" in out


# -- the measured table and the speed rules ------------------------------------------------------------------------


def _bench(kernels: Dict[str, str], dtype: str = "fp32") -> Dict[str, Any]:
    """A small `bench mixer --device cuda` payload: N 1,024 × batch 1, PoM causal (the unfused route faster than the
    torch form, the fused route not faster than it in the forward, faster than both in training), PoM full (the
    unfused route slower), the value PoM causal (its kernels faster; at attention's size faster in the forward
    only)."""
    times = {"pom matmuls (floor)": (0.1, 0.3), "pom causal": (1.0, 3.0), "pom causal triton": (0.5, 1.5),
             "pom causal triton_gemm": (0.8, 1.4), "pom full": (1.0, 3.0), "pom full triton": (1.2, 3.5),
             "value pom matmuls (floor)": (0.2, 0.6), "value pom causal": (2.0, 6.0),
             "value pom causal triton": (1.0, 3.0), "value pom att-sized causal": (2.0, 6.0),
             "value pom att-sized causal triton": (1.5, 7.0), "sdpa causal": (0.3, 0.9),
             "pom causal compiled": (0.2, 0.5)}
    rows = [{"N": 1024, "batch": 1, "mixer": k, "fwd_ms": f, "fwdbwd_ms": b} for k, (f, b) in times.items()]
    return {"config": {"dim": 8, "expand": 2, "degree": 2, "dtype": dtype, "device": "cuda", "value_dim": 8,
                       "value_heads": 2},
            "machine": {"gpu": "NVIDIA H100 80GB HBM3", "capability": "sm_90", "date": "2026-12-01 10:00:00",
                        "torch": torch.__version__, "kernels": kernels},
            "rows": rows}


def _interpreter() -> None:
    """Skip unless Triton runs its interpreter on CPU tensors (the default run; not POLYMIXER_TEST_DEVICE=cuda)."""
    pytest.importorskip("triton")
    from polymixer.ops.triton_common import interpreted

    if not interpreted():
        pytest.skip("CPU tensors stand in for a GPU's under TRITON_INTERPRET=1 only")


@pytest.fixture
def on_a_gpu(monkeypatch):
    """CPU tensors taken for an sm_90 GPU's by the automatic choice (the interpreter runs the kernels): the Triton
    routes' prechecks let them through and their architecture is sm_90."""
    from polymixer.ops import dispatch, measured

    _interpreter()
    for key in (("pom", "triton"), ("pom", "triton_gemm"), ("value_pom", "triton")):
        monkeypatch.setitem(dispatch._PRECHECKS, key, lambda call, explicit=False: None)
    monkeypatch.setattr(measured, "arch_of", lambda device_type, index: "sm_90")


def _table(tmp_path, kernels: Dict[str, str], name: str = "table.json") -> Path:
    from polymixer.experiments.bench import dispatch_table

    src, out = tmp_path / f"bench-{name}", tmp_path / name
    src.write_text(json.dumps(_bench(kernels)))
    assert dispatch_table.main(["--from", str(src), "--out", str(out)]) == 0
    return out


def _now() -> Dict[str, str]:
    from polymixer.ops import measured

    return {op: measured.kernel_hash(op) for op in ("pom", "value_pom")}


def _rule(result: Dict[str, Any], name: str) -> str:
    """The rule that decided route ``name``: the taken backend's, or the one named in its reason for passing over."""
    if result["backend"] == name:
        return result["rule"]
    return result["passed_over"][name].split(":")[0]


def test_a_bench_run_becomes_the_table(tmp_path):
    """Each (Triton route, pass) row of the bench with the torch form's row beside it is an entry: its times, ratio,
    the later routes it had to beat, and whether it was faster by the margin; the run keeps the card, the kernel
    hashes and the bandwidths the mixing kernels and the torch form reached."""
    from polymixer.ops import measured

    table = measured.load(_table(tmp_path, {"pom": "aaaaaaaaaaaa", "value_pom": "bbbbbbbbbbbb"}))
    (run,) = table["runs"]
    assert (run["arch"], run["gpu"], run["kernels"]) == ("sm_90", "NVIDIA H100 80GB HBM3",
                                                         {"pom": "aaaaaaaaaaaa", "value_pom": "bbbbbbbbbbbb"})
    got = {(e["op"], e.get("variant", ""), e["backend"], e["mode"], e["pass"]): e for e in run["entries"]}
    assert len(got) == 10 and all(e["length"] == 1024 and e["tokens"] == 1024 for e in got.values())
    want = {("pom", "", "triton", "causal", "forward"): (True, {}),
            ("pom", "", "triton", "causal", "forward+backward"): (True, {}),
            ("pom", "", "triton_gemm", "causal", "forward"): (False, {"triton": 0.5}),  # slower than the unfused route
            ("pom", "", "triton_gemm", "causal", "forward+backward"): (True, {"triton": 1.5}),  # 1.4 ≤ 0.95 × 1.5
            ("pom", "", "triton", "full", "forward"): (False, {}),
            ("pom", "", "triton", "full", "forward+backward"): (False, {}),
            ("value_pom", "", "triton", "causal", "forward"): (True, {}),
            ("value_pom", "", "triton", "causal", "forward+backward"): (True, {}),
            ("value_pom", "att-sized", "triton", "causal", "forward"): (True, {}),  # 1.5 ≤ 0.95 × 2
            ("value_pom", "att-sized", "triton", "causal", "forward+backward"): (False, {})}
    assert {k: (e["faster"], e["rivals"]) for k, e in got.items()} == want
    assert got[("pom", "", "triton", "causal", "forward")]["ratio"] == 0.5
    eff = run["efficiency"]["pom"]["forward"]
    # the slowest kernels: the full rows' 3 passes of 1024 × 16 fp32 elements in 1.1 ms; the fastest torch form:
    # the causal rows' 25 counted passes in 0.9 ms
    assert eff["kernels_bytes_per_s"] == pytest.approx(1024 * 16 * 4 * 3 / 1.1e-3, rel=1e-2)
    assert eff["torch_bytes_per_s"] == pytest.approx(1024 * 16 * 4 * 25 / 0.9e-3, rel=1e-2)
    assert eff["kernels_fraction"] == pytest.approx(eff["kernels_bytes_per_s"] / 3.35e12, rel=1e-2)  # H100 SXM


def test_the_dispatcher_follows_the_measurements_of_its_own_kernels(tmp_path, on_a_gpu):
    """Measured faster → taken ("table entry"); measured slower → passed over, with the times; a measurement puts
    the fused route in the automatic choice where it beat both the torch form and the unfused route; where two
    measurements of a case disagree (the value PoM in training: faster at one size, slower at attention's), the
    route is passed over."""
    from polymixer.ops import measured

    m, v = PoM(8), ValuePoM(8, value_dim=8, heads=2)
    x = torch.randn(1, 20, 8)
    pom_args = (x, m.weights)
    with measured.use_table(_table(tmp_path, _now())):
        with torch.no_grad():
            causal = backend_for("pom", *pom_args, causal=True)
            full = backend_for("pom", *pom_args)
            value = backend_for("value_pom", x, v.weights, causal=True, heads=2)
        trained = backend_for("pom", *pom_args, causal=True)
        value_trained = backend_for("value_pom", x, v.weights, causal=True, heads=2)
    assert causal["backend"] == "triton" and causal["rule"] == "table entry"
    assert causal["reason"].startswith("measured faster on sm_90") and "0.5 ms against the torch form's 1 ms" in \
        causal["reason"]
    assert causal["passed_over"]["triton_gemm"].startswith("table entry: measured slower on sm_90")
    assert "triton's 0.5 ms" in causal["passed_over"]["triton_gemm"]
    assert full["backend"] in ("cpu", "torch")
    assert full["passed_over"]["triton"].startswith("table entry: measured slower on sm_90")
    assert "1.2 ms against the torch form's 1 ms" in full["passed_over"]["triton"]
    assert (value["backend"], value["rule"]) == ("triton", "table entry")
    assert (trained["backend"], trained["rule"]) == ("triton_gemm", "table entry")
    assert value_trained["backend"] == "torch"
    assert value_trained["passed_over"]["triton"].startswith("table entry: measured slower on sm_90")
    assert "7 ms against the torch form's 6 ms" in value_trained["passed_over"]["triton"]


def test_a_measurement_of_other_kernel_code_decides_nothing(tmp_path, on_a_gpu):
    """Entries whose run measured other kernel code are ignored, and backend_for says so: PoM's unfused route falls
    to the model (recomputed from measured bandwidth), the fused route and the value PoM's kernels to "no
    measurement" — they stay out."""
    from polymixer.ops import measured

    m, v = PoM(8), ValuePoM(8, value_dim=8, heads=2)
    x = torch.randn(1, 20, 8)
    with measured.use_table(_table(tmp_path, {"pom": "0123456789ab", "value_pom": "ba9876543210"})), torch.no_grad():
        pom = backend_for("pom", x, m.weights, causal=True)
        value = backend_for("value_pom", x, v.weights, causal=True, heads=2)
    assert _rule(pom, "triton") == "model"
    assert "ran other kernel code, 0123456789ab" in (pom["reason"] or pom["passed_over"].get("triton", ""))
    assert pom["passed_over"]["triton_gemm"].startswith("no measurement: nothing measured triton_gemm")
    assert value["backend"] == "torch" and value["passed_over"]["triton"].startswith("no measurement: ")
    assert "ran other kernel code, ba9876543210" in value["passed_over"]["triton"]


def test_the_shipped_table_is_the_h200_run_of_the_old_kernels(tmp_path, on_a_gpu, monkeypatch):
    """The shipped table holds the H200 runs of docs/bench (kernels b21063e5e0dd and 5487ef35e1c0). On those
    kernels it decides (the unfused PoM route taken, the fused route and the value PoM's training kernels measured
    slower); on any other kernel code it decides nothing and backend_for says so."""
    from polymixer.ops import measured

    shipped = measured.load(measured.TABLE_PATH)
    assert {r["source"] for r in shipped["runs"]} == {"docs/bench/gpu_h200/mixer.json",
                                                      "docs/bench/gpu_h200_compiled/mixer.json"}
    assert all(r["arch"] == "sm_90" and r["kernels"] == {"pom": "b21063e5e0dd", "value_pom": "5487ef35e1c0"}
               for r in shipped["runs"])
    old = tmp_path / "old_kernels.py"
    old.write_text("# kernels that are not those of the table\n")
    monkeypatch.setitem(measured.KERNEL_FILES, "pom", old)
    monkeypatch.setitem(measured.KERNEL_FILES, "value_pom", old)
    measured.kernel_hash.cache_clear()
    try:
        m, v = PoM(64).bfloat16(), ValuePoM(64, value_dim=64, heads=2).bfloat16()
        x = torch.randn(64, 1024, 64, dtype=torch.bfloat16)
        args = (x, m.weights)
        vargs = (x, v.weights)
        with measured.use_table(shipped):
            other = backend_for("pom", *args, causal=True)
            other_value = backend_for("value_pom", *vargs, causal=True, heads=2)
        hashed = measured.kernel_hash("pom")
        same = dict(shipped, runs=[dict(r, kernels={"pom": hashed, "value_pom": hashed}) for r in shipped["runs"]])
        with measured.use_table(same):
            with torch.no_grad():
                inference = backend_for("pom", *args, causal=True)
            training = backend_for("pom", *args, causal=True)
            value = backend_for("value_pom", *vargs, causal=True, heads=2)
    finally:
        measured.kernel_hash.cache_clear()
    assert "ran other kernel code, b21063e5e0dd" in (other["reason"] or "") + "".join(other["passed_over"].values())
    assert _rule(other, "triton") == "model" and _rule(other, "triton_gemm") == "no measurement"
    assert _rule(other_value, "triton") == "no measurement" and other_value["backend"] == "torch"
    assert "ran other kernel code, 5487ef35e1c0" in other_value["passed_over"]["triton"]
    assert (inference["backend"], inference["rule"]) == ("triton", "table entry")
    assert inference["passed_over"]["triton_gemm"].startswith("table entry: measured slower on sm_90 (NVIDIA H200")
    assert (training["backend"], training["rule"]) == ("triton", "table entry")
    assert value["backend"] == "torch" and value["passed_over"]["triton"].startswith("table entry: measured slower")


def test_an_explicit_choice_ignores_the_table(tmp_path):
    """backend("triton") stays strict and takes the route a measurement says is slower (and the interpreter)."""
    from polymixer.ops import measured

    _interpreter()
    m = PoM(8)
    x = torch.randn(1, 20, 8)
    with measured.use_table(_table(tmp_path, _now())), backend("triton"), torch.no_grad():
        got = backend_for("pom", x, m.weights)
    assert got == {"backend": "triton", "explicit": True, "rule": None, "reason": None, "passed_over": {}}


def test_the_choice_and_its_rule_are_logged(tmp_path, on_a_gpu, caplog):
    from polymixer.ops import dispatch, measured
    from polymixer.ops.pom.call import make_pom_call

    m = PoM(8)
    x = torch.randn(1, 20, 8)
    with measured.use_table(_table(tmp_path, _now())), torch.no_grad():
        call = make_pom_call(x, m.weights, None, {})
        with caplog.at_level(logging.DEBUG, logger="polymixer.ops"):
            dispatch.choose("pom", call)
            call = make_pom_call(x, m.weights, None, dict(causal=True))
            dispatch.choose("pom", call)
    text = [r.message for r in caplog.records]
    assert any(t.startswith("pom on cpu") and "triton passed over: table entry: measured slower" in t for t in text)
    assert any(t.startswith("pom on triton (table entry: measured faster") for t in text), text


@pytest.mark.usefixtures("traced_kernels")
def test_the_automatic_choice_and_its_rule_compile(tmp_path, on_a_gpu):
    """Under torch.compile(fullgraph=True) the speed rule is decided while dynamo traces (a constant of the graph):
    the route measured faster is in the graph, the one measured slower is not."""
    from polymixer.ops import measured

    m = PoM(8)
    ops: List[str] = []

    def recorder(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)

    x = torch.randn(1, 20, 8)
    with measured.use_table(_table(tmp_path, _now())), torch.no_grad():
        for causal, taken in ((True, True), (False, False)):
            torch._dynamo.reset()
            ops.clear()
            got = torch.compile(lambda x: m(x, causal=causal), fullgraph=True, backend=recorder)(x)
            with backend("torch"):
                torch.testing.assert_close(got, m(x, causal=causal), rtol=1e-5, atol=1e-6)
            assert any("polymixer.pom_mix" in o for o in ops) == taken, ops
    torch._dynamo.reset()


def test_the_cost_model_takes_its_efficiencies_from_the_table(tmp_path):
    """The mixing kernels' bandwidth in the roofline model is the slowest measured, not an assumed 80%; without a
    measurement the assumption is said to be one."""
    from polymixer.experiments.bench import roofline
    from polymixer.ops import measured
    from polymixer.ops.pom import cost

    with measured.use_table(_table(tmp_path, _now())):
        eff, source = roofline.mix_efficiency(train=True)
        run = measured.table()["runs"][0]["efficiency"]["pom"]["forward+backward"]
        assert (eff, source) == (run["kernels_fraction"], "measured")
        assert roofline.pom_routes(8192, 128, 256, 256)["mix_efficiency"] == eff
    from polymixer.experiments.bench import dispatch_table

    with measured.use_table(dispatch_table.build_table([])):
        assert roofline.mix_efficiency() == (0.80, "assumed (no measurement in the table)")
        assert cost.pom_kernels_vs_torch(measured.Case("pom", "cuda", 0, "causal", 1024, 1024, "bf16", "forward",
                                                       1)) is None


def test_the_table_tool_refuses_what_it_cannot_read(tmp_path, capsys):
    from polymixer.experiments.bench import dispatch_table

    bench = _bench(_now())
    del bench["machine"]["capability"]
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(bench))
    assert dispatch_table.main(["--from", str(src), "--out", str(tmp_path / "t.json")]) == 2
    assert "records no compute capability" in capsys.readouterr().err
    assert dispatch_table.main(["--from", str(src), "--out", str(tmp_path / "t.json"), "--arch", "sm_80"]) == 0
    from polymixer.ops import measured

    assert measured.load(tmp_path / "t.json")["runs"][0]["arch"] == "sm_80"


# -- the torch form's counted passes (the model's other side) -----------------------------------------------------


class _Traffic(TorchDispatchMode):
    """Bytes of every aten op's per-token tensors (≥ ``least`` elements), GEMMs and views left out."""

    def __init__(self, least: int) -> None:
        super().__init__()
        self.least = least
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("mm", "addmm", "bmm") or func.is_view:
            return out
        ts = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        self.bytes += sum(t.numel() * t.element_size() for t in ts if t.numel() >= self.least)
        return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_torch_forms_passes_are_counted(dtype):
    """cost.TORCH_FORM_PASSES are the torch form's elementwise passes per N·D element as counted on its aten ops
    (B 2, N 512, d 64, D 128, a gate per 16 channels; packed: 1 × 1,024 in four sequences)."""
    from polymixer.ops.pom import cost

    cu = torch.tensor([0, 300, 301, 700, 1024], dtype=torch.int32)
    modes = {"causal": dict(causal=True), "full": {}, "block-causal": dict(causal=True, block_size=64),
             "packed causal": dict(causal=True, cu_seqlens=cu), "packed full": dict(cu_seqlens=cu),
             "packed block-causal": dict(causal=True, block_size=64, cu_seqlens=cu)}
    e = torch.empty((), dtype=dtype).element_size()
    for mode, kw in modes.items():
        m = PoM(64, expand=2, sel_heads=8).to(dtype)  # fresh: no gradient to accumulate into
        x = torch.randn(1 if "cu_seqlens" in kw else 2, 1024 if "cu_seqlens" in kw else 512, 64, dtype=dtype,
                        requires_grad=True)
        tokens = x.shape[0] * x.shape[1]
        unit = tokens * m.poly_dim * e
        with backend("torch"):
            with torch.no_grad(), _Traffic(tokens * 16) as fwd:
                m(x, **kw)
            y = m(x, **kw)
            dy = torch.randn_like(y)
            with _Traffic(tokens * 16) as bwd:
                y.backward(dy)
        want = cost.TORCH_FORM_PASSES[(mode, e)]
        assert (fwd.bytes / unit, bwd.bytes / unit) == (pytest.approx(want[0], abs=1.0),
                                                        pytest.approx(want[1], abs=1.0)), mode
