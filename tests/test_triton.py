"""The Triton backends of PoM (both routes: ``triton``, z in memory, and ``triton_gemm``, the input projection fused
into the kernels) and of the value-carrying PoM against the float64 oracle: outputs and the gradients of the input
and of every parameter, in every mode the kernels take, on tiny shapes that cross chunks, channel blocks, splits
and sequences.

Without a GPU the kernels run in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``, set by conftest.py
before Triton is imported); with ``POLYMIXER_TEST_DEVICE=cuda`` they run compiled on the GPU. Skipped without
Triton (the ``[gpu]`` extra). torch.compile / torch.export of the kernels: tests/test_kernel_ops.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from polymixer import PoM, ValuePoM  # noqa: E402
from polymixer.ops import backend, backend_for  # noqa: E402
from polymixer.ops import triton_common as tc  # noqa: E402
from polymixer.ops.pom import triton_kernels as tk  # noqa: E402

CU = torch.tensor([0, 5, 6, 17, 21], dtype=torch.int32)  # four packed sequences, one of a single token
ROUTES = ["triton", "triton_gemm"]
SLOW = pytest.mark.slow  # the interpreter takes seconds per case: the default run keeps one case per kernel path


@pytest.fixture(autouse=True)
def small_tiles(device):
    """Chunks of 8 tokens, blocks of 8 channels, steps of 16 input features, scans of 2 chunks a step: tiny inputs
    still cross chunks, channel blocks, scan steps and sequences."""
    if device.type == "cpu" and not tc.interpreted():
        pytest.skip("CPU tensors need TRITON_INTERPRET=1 (conftest.py sets it unless POLYMIXER_TEST_DEVICE=cuda)")
    tk.use_config(tk.LaunchConfig(8, 8, 1, 16, scan_chunks=2))
    yield
    tk.use_config(None)


def _mixer(dim: int = 8, **kw) -> PoM:
    m = PoM(dim, bias=True, **{"degree": 3, "expand": 2, **kw})
    with torch.no_grad():
        m.coeff.uniform_(-1.0, 1.0)
        m.gate_bias.normal_()
    return m


def _run(m: PoM, x: torch.Tensor, name: str, **kw) -> list:
    """(y, dL/dx, dL/dα, dL/db, dL/dW_in, dL/dW_o) of L = Σ y² on backend ``name``."""
    m.zero_grad()
    x = x.detach().clone().requires_grad_()
    with backend(name):
        y = m(x, **kw)
    y.square().sum().backward()
    return [y.detach(), x.grad, m.coeff.grad, m.gate_bias.grad, m.in_proj.weight.grad, m.out_proj.weight.grad]


def rtol_of(route: str, device: torch.device, rtol: float = 1e-5) -> float:
    """The tolerance against the oracle: the fused products run in tf32 on a GPU."""
    return max(rtol, 5e-3) if device.type == "cuda" and route == "triton_gemm" else rtol


def _check(m: PoM, x: torch.Tensor, device: torch.device, rtol: float = 1e-5, route: str = "triton", **kw) -> None:
    rtol = rtol_of(route, device, rtol)
    got = _run(m.to(device, torch.float32), x.to(device, torch.float32), route, **kw)
    ref_kw = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    want = _run(m.cpu().double(), x.cpu().double(), "reference", **ref_kw)
    for name, a, b in zip(("y", "dx", "dcoeff", "dbias", "dW_in", "dW_o"), got, want):
        err = (a.cpu().double() - b).abs().max().item() / (b.abs().max().item() + 1e-30)
        assert err <= rtol, f"{name}: relative error {err:.2e} > {rtol:.0e}"


MODES = {
    "full": {},
    "causal": dict(causal=True),
    "block-causal (block < chunk)": dict(causal=True, block_size=3),
    "block-causal (block > chunk)": dict(causal=True, block_size=11),
}


@pytest.mark.parametrize("route, mode", [
    (r, m) if (r == "triton" and m != "block-causal (block > chunk)") or (r, m) == ("triton_gemm", "full")
    else pytest.param(r, m, marks=SLOW) for r in ROUTES for m in MODES])
@pytest.mark.usefixtures("traced_kernels")
def test_modes_match_the_oracle(mode, route, device):
    _check(_mixer(), torch.randn(2, 21, 8), device, route=route, **MODES[mode])


SPREAD_MODES = {"causal": dict(causal=True), "block-causal": dict(causal=True, block_size=3),
                "packed full": dict(cu_seqlens=CU, mask=torch.rand(1, 21) > 0.2)}


@pytest.mark.parametrize("route, mode", [
    (r, m) if (r, m) in (("triton", "causal"), ("triton", "packed full"), ("triton_gemm", "causal"))
    else pytest.param(r, m, marks=SLOW) for r in ROUTES for m in SPREAD_MODES])
@pytest.mark.usefixtures("traced_kernels")
def test_programs_of_several_chunks_and_scans_of_several_steps_match_the_oracle(route, mode, device):
    """Chunks of 4 tokens, 3 to a program (the last program's group cut short), the scan over the chunks 2 at a
    step: the carries cross programs and scan steps — forward and backward, in a causal, an end-token and a packed
    mode."""
    tk.use_config(tk.LaunchConfig(4, 8, 1, 16, chunks_per_program=3, scan_chunks=2))
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in SPREAD_MODES[mode].items()}
    x = torch.randn(1 if "cu_seqlens" in kw else 2, 21, 8)
    _check(_mixer(), x, device, route=route, **kw)
    layout = tk.mix_layout(2, 21, 16, 16, 3, 0, 1, 1, 0, device)
    assert (layout.nc, layout.chunks_per_program, layout.npb) == (6, 3, 2)


@SLOW
@pytest.mark.usefixtures("traced_kernels")
def test_long_rows_carry_exactly(device):
    """A row of 1,500 tokens in chunks of 8 (188 chunks, the scan 2 at a step): the carries are summed in float64,
    so the running means stay within 1e-5 of the oracle at the row's end, forward and backward."""
    _check(_mixer(), torch.randn(1, 1500, 8), device, causal=True)
    _check(_mixer(), torch.randn(1, 1500, 8), device, causal=True, block_size=37)


def test_programs_fill_the_gpu():
    """Every pass is parallel over (row, chunk, channel block): a wide batch gives each program 8 chunks in a row
    (fewer partial rows of the parameter gradients), one long row as many programs as a batch of the same tokens —
    never a serial walk along a row."""
    tk.use_config(None)
    cpu = torch.device("cpu")  # counted as 132 SMs
    wide = tk.mix_layout(16, 4096, 1024, 1024, 2, 0, 1, 1, 0, cpu)
    long = tk.mix_layout(1, 65536, 1024, 1024, 2, 0, 1, 1, 0, cpu)
    for layout in (wide, long):
        assert layout.chunks_per_program == 8
        assert layout.B * layout.npb * layout.nd("apply") >= 4 * 132
    short = tk.mix_layout(1, 256, 1024, 1024, 2, 0, 1, 1, 0, cpu)  # 4 chunks × 16 channel blocks: one chunk each
    assert short.chunks_per_program == 1 and short.npb == short.nc


@SLOW
def test_sum_reduction(device):
    _check(_mixer(reduction="sum"), torch.randn(2, 21, 8), device, causal=True)
    _check(_mixer(reduction="sum"), torch.randn(2, 21, 8), device)


@pytest.mark.parametrize("causal", [pytest.param(False, marks=SLOW), True])
@pytest.mark.usefixtures("traced_kernels")
def test_key_padding(causal, device):
    mask = torch.rand(2, 21) > 0.35
    mask[1, :7] = False  # a row whose first queries see nothing: H = 0, never NaN
    _check(_mixer(), torch.randn(2, 21, 8), device, causal=causal, mask=mask.to(device))


@pytest.mark.parametrize("mode", ["full", "causal", "block"])
@pytest.mark.usefixtures("traced_kernels")
def test_packed_sequences(mode, device):
    kw = {"full": {}, "causal": dict(causal=True), "block": dict(causal=True, block_size=3)}[mode]
    mask = torch.rand(1, 21) > 0.2
    _check(_mixer(), torch.randn(1, 21, 8), device, cu_seqlens=CU.to(device), mask=mask.to(device), **kw)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("causal", [pytest.param(False, marks=SLOW), True])
@pytest.mark.usefixtures("traced_kernels")
def test_rotary_1d(causal, route, device):
    _check(_mixer(rope="1d"), torch.randn(2, 21, 8), device, route=route, causal=causal)
    _check(_mixer(rope="1d"), torch.randn(1, 21, 8), device, route=route, causal=causal, cu_seqlens=CU.to(device))


@pytest.mark.usefixtures("traced_kernels")
def test_rotary_at_long_range(device):
    """Angles of positions near 10⁶ are reduced modulo 2π in float64 inside the kernels, as the torch form does."""
    pos = torch.arange(21) * 47_000 + 3
    _check(_mixer(rope="1d"), torch.randn(2, 21, 8), device, causal=True, positions=pos.to(device))


def test_rotary_base_reaches_the_kernels_as_float64():
    """On a GPU Triton passes a Python float argument as fp32 unless the kernel annotates it (the interpreter keeps
    a double, so only this check sees it): every kernel that takes log2(base) declares it float64, and the
    ahead-of-time builds give it that type — else the angles at long range lose 24 bits (3.6e-4 off on an H200)."""
    import inspect

    from polymixer.experiments.bench import aot

    takes = {name: k for name, k in tk.KERNELS.items() if "log2base" in k.arg_names}
    assert takes
    for name, k in takes.items():  # the JIT's and the interpreter's wrappers both keep the function as .fn
        annotation = inspect.signature(k.fn).parameters["log2base"].annotation
        assert "float64" in str(annotation), (name, annotation)
    assert "log2base" in aot.F64_SCALARS


@pytest.mark.usefixtures("traced_kernels")
def test_rotary_2d(device):
    rows, cols = torch.meshgrid(torch.arange(3), torch.arange(5), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], -1)  # a 3 × 5 grid
    _check(_mixer(rope="2d"), torch.randn(2, 15, 8), device, positions=pos.to(device))


@pytest.mark.parametrize("route", ["triton", pytest.param("triton_gemm", marks=SLOW)])
@pytest.mark.parametrize("degree, sel_heads", [(5, 4), pytest.param(1, 1, marks=SLOW), pytest.param(2, 4, marks=SLOW),
                                               pytest.param(1, 4, marks=SLOW), pytest.param(5, 1, marks=SLOW)])
@pytest.mark.usefixtures("traced_kernels")
def test_degrees_and_gate_heads(degree, sel_heads, route, device):
    _check(_mixer(degree=degree, sel_heads=sel_heads), torch.randn(2, 13, 8), device, route=route, causal=True)
    if sel_heads > 1:
        _check(_mixer(degree=degree, sel_heads=sel_heads), torch.randn(2, 13, 8), device, route=route)


@pytest.mark.parametrize("mode", [dict(causal=True), pytest.param({}, marks=SLOW),
                                  pytest.param(dict(causal=True, block_size=5), marks=SLOW)],
                         ids=["causal", "full", "block-causal"])
@pytest.mark.parametrize("rope", [None, "1d"])
@pytest.mark.usefixtures("traced_kernels")
def test_gate_heads_wider_than_a_tile(mode, rope, device):
    """Gate heads of 16 channels in tiles of 8 (GPPoM2-S's heads of 128 in tiles of 32 or 64): each head is split
    over two programs, whose shares of dL/dz_s the host sums — against the oracle, with rotary too."""
    m = _mixer(16, sel_heads=2, rope=rope)
    layout = tk.mix_layout(2, 21, 32, 2, 3, 0, 1, 1, int(rope is not None), device)
    assert layout.head_parts("grad_apply") == 2
    _check(m, torch.randn(2, 21, 16), device, **mode)


@pytest.mark.parametrize("gate, activation", [("sigmoid", "gelu")] + [
    pytest.param(g, a, marks=SLOW) for g in ("sigmoid", "identity")
    for a in ("relu", "identity", "silu", "gelu", "tanh")
    if (g, a) != ("sigmoid", "gelu")])
@pytest.mark.usefixtures("traced_kernels")
def test_non_linearities(gate, activation, device):
    _check(_mixer(gate=gate, activation=activation), torch.randn(2, 11, 8), device)


@pytest.mark.parametrize("n", [1, pytest.param(2, marks=SLOW), pytest.param(9, marks=SLOW)])
@pytest.mark.usefixtures("traced_kernels")
def test_odd_lengths(n, device):
    _check(_mixer(), torch.randn(3, n, 8), device, causal=True)
    _check(_mixer(), torch.randn(3, n, 8), device)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.usefixtures("traced_kernels")
def test_bf16_is_within_the_torch_forms_tolerance(route, device):
    """bf16 activations, fp32 accumulation: the kernels stay as close to the float64 oracle as the torch form does."""
    m = _mixer().to(device)
    x = torch.randn(2, 21, 8, device=device)
    exact = _run(m.double(), x.double(), "reference", causal=True)[0]
    m = m.float()
    errs = {}
    for name in (route, "torch"):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            y = _run(m, x, name, causal=True)[0]
        errs[name] = (y.double() - exact).abs().max().item() / exact.abs().max().item()
    assert errs[route] <= 2 * errs["torch"] + 1e-3, errs


@pytest.mark.parametrize("case", [("causal", "triton"), ("full", "triton"), ("full", "triton_gemm")])
@pytest.mark.usefixtures("traced_kernels")
def test_hbm_passes_are_counted_as_modelled(case):
    """The interpreter counts each kernel's distinct bytes read and written, as
    :func:`polymixer.ops.pom.cost.hbm_passes` models them. The end-token modes move the floor (forward: read z_h, z_s,
    write g = 3 passes over N·D; backward: read z_h, z_s, dg, write dz_h, dz_s = 5); causal mixing one pass more each
    way (its chunk sums read z_h, and z_s and dg in the backward, before the apply reads them again); the fused route
    reads x instead of z."""
    if not tc.interpreted():
        pytest.skip("the addresses are counted in Triton's interpreter (TRITON_INTERPRET=1)")
    from polymixer.experiments.bench import traffic
    from polymixer.ops.pom.cost import hbm_passes

    mode, route = case
    tk.use_config(None)
    r = traffic.count(traffic.Case(mode, route), B=1, N=128, d=16, D=32)
    model = hbm_passes("causal" if mode == "causal" else "end", fused=route == "triton_gemm", d_over_D=0.5)
    assert r["forward"]["passes"] == pytest.approx(model["forward"], abs=0.02)
    assert r["backward"]["passes"] == pytest.approx(model["backward"], abs=0.02)
    if route == "triton":
        extra = 1.0 if mode == "causal" else 0.0
        assert r["forward"]["passes"] == pytest.approx(3.0 + extra, abs=0.02)
        assert r["backward"]["passes"] == pytest.approx(5.0 + 2 * extra, abs=0.02)


@pytest.mark.parametrize("mode", ["causal", "full", pytest.param("block", marks=SLOW)])
def test_each_kernel_alone_declares_the_bytes_it_moves(mode):
    """The GPU script's hook (``bench_kernels``): every kernel of a forward and a backward runs alone, and the bytes
    each declares — what its bandwidth is computed from — are what the interpreter counts it moving (within 5%: the
    weights and the parameter-gradient partials are left out of the declaration)."""
    if not tc.interpreted():
        pytest.skip("the addresses are counted in Triton's interpreter (TRITON_INTERPRET=1)")
    from polymixer.experiments.bench import traffic

    tk.use_config(None)
    kernels = tk.bench_kernels(2, 256, 64, 64, 2, mode, torch.bfloat16, torch.device("cpu"))
    assert [k[0] for k in kernels] == ["sums", "scan", "apply", "grad_sums", "grad_apply"]
    for name, run, declared in kernels:
        assert traffic.counted_bytes(run) == pytest.approx(declared, rel=0.05), name


@pytest.mark.usefixtures("traced_kernels")
def test_deterministic(device):
    m = _mixer().to(device)
    x = torch.randn(2, 21, 8, device=device)
    a, b = _run(m, x, "triton", causal=True), _run(m, x, "triton", causal=True)
    assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_offsets_are_64_bit(device):
    """A row or chunk offset past 2³¹ elements (B·N·D ≥ 2³¹: B 32, N 16k, D 4k) is computed in 64 bits — the
    32-bit product these kernels used to form wraps around."""
    import triton
    import triton.language as tl

    @triton.jit
    def offsets(out_ptr, stride):
        b = tl.program_id(0) + 3
        tl.store(out_ptr + tl.program_id(0), tc.offset64(b, stride))

    stride = 2 ** 30 + 16  # an int32 argument, like the row stride of a (B, 16k, 64k) tensor
    out = torch.zeros(2, dtype=torch.int64, device=device)
    offsets[(2,)](out, stride)
    assert out.tolist() == [3 * stride, 4 * stride]
    wrapped = torch.tensor([3, 4], dtype=torch.int32) * torch.tensor(stride, dtype=torch.int32)
    assert wrapped.tolist() != out.tolist()  # what 32-bit arithmetic gives


def test_the_dispatcher_routes_and_refuses_clearly(device):
    m = _mixer().to(device)
    x = torch.randn(1, 6, 8, device=device)
    args = (x, m.weights)
    for route in ROUTES:
        with backend(route):
            assert backend_for("pom", *args, causal=True)["backend"] == route
            with pytest.raises(NotImplementedError, match=f"backend '{route}' cannot take this pom call: cross-mix"):
                m(x, torch.randn(1, 4, 8, device=device))
            with pytest.raises(NotImplementedError, match=r"explicit \(B, M, N\) mask"):
                m(x, mask=torch.ones(1, 6, 6, dtype=torch.bool, device=device))
    auto = backend_for("pom", *args, causal=True)
    if device.type == "cpu":  # the interpreter is never chosen automatically
        assert auto["backend"] == "cpu" and "CUDA tensors only" in auto["passed_over"]["triton"]
    else:  # a Triton route where a measurement or the model says it is faster, else the torch form saying why
        assert auto["backend"] in ROUTES or auto["passed_over"]["triton"].startswith(("model", "no measurement"))


def test_the_fused_routes_roofline_prediction():
    """What the roofline model predicts for the fused route (a prediction, kept for ``bench roofline`` and the
    guide: the automatic choice takes the fused route only where a GPU measured it faster, tests/test_dispatch.py):
    fp32 without tf32 never; a narrow, memory-bound bf16 layer for training and inference; a GPT-2-sized layer with
    a gate per head not (its fused GEMM tile streams too little work per byte)."""
    from polymixer.experiments.bench.roofline import predicted_win
    from polymixer.ops.pom.call import make_pom_call

    def reason(dim: int, tokens: int, train: bool, heads: int = 1):
        m = PoM(dim, expand=2, sel_heads=heads)
        x = torch.randn(1, tokens, dim)
        with torch.set_grad_enabled(train), torch.autocast("cpu", dtype=torch.bfloat16):
            call = make_pom_call(x, m.weights, None, dict(causal=True))
            return predicted_win(call)

    m = _mixer(64)
    call = make_pom_call(torch.randn(2, 64, 64), m.weights, None, {})
    assert "fp32 products without tf32" in predicted_win(call)
    assert reason(128, 8192, train=True) is None and reason(128, 8192, train=False) is None
    assert "predicts the unfused route faster" in reason(768, 8192, train=False, heads=12)


@pytest.mark.parametrize("key", [pytest.param(k, marks=() if k == (False, False, 16) else SLOW,
                                              id=f"{'fused' if k[0] else 'unfused'}{'-rope' if k[1] else ''}-G{k[2]}")
                                 for k in tk.TILES])
@pytest.mark.usefixtures("traced_kernels")
def test_every_tile_matches_the_oracle(key, device):
    """The tiles the dispatcher picks on a GPU (not the tests' tiny ones), per route, rotary and gate-head class:
    causal and full over a length that crosses a chunk of every kernel, against the oracle — forward and backward
    where every kernel has a tile that fits the registers, the forward alone where only the forward's do, and a
    clear refusal where not even those do."""
    fused, rope, hc = key
    tk.use_config(None)  # the dispatcher's own choice
    G = 1 if hc == 16 else hc
    D = 2 * 2 * max(hc, 32) if rope else 2 * max(hc, 32)  # two channel blocks of the widest tile
    m = _mixer(D // 2, degree=2, expand=2, rope="1d" if rope else None, **({"sel_heads": D // G} if G > 1 else {}))
    route = "triton_gemm" if fused else "triton"
    x = torch.randn(1, 64 + 5, D // 2)
    for kw in (dict(causal=True), {}):
        layout = tk.mix_layout(1, 69, D, D // G, 2, 0 if kw else 1, 1, 1, int(rope), device, fused)
        if layout.missing(backward=True) is None:
            _check(m, x, device, route=route, **kw)
        elif layout.missing(backward=False) is None:  # inference only: the forward against the oracle
            xd = x.to(device, torch.float32)
            with torch.no_grad(), backend(route):
                y = m.to(device, torch.float32)(xd, **kw)
            with backend("reference"):
                want = m.cpu().double()(x.double(), **kw)
            assert (y.cpu().double() - want).abs().max() <= rtol_of(route, device) * want.abs().max()
            with backend(route), pytest.raises(NotImplementedError, match="fits the registers"):
                m.to(device, torch.float32)(xd.clone().requires_grad_(), **kw)
        else:
            with torch.no_grad(), backend(route), pytest.raises(NotImplementedError, match="fits the registers"):
                m.to(device, torch.float32)(x.to(device, torch.float32), **kw)


@pytest.mark.parametrize("every", [False, pytest.param(True, marks=SLOW)], ids=["default-configs", "every-config"])
def test_the_kernels_build_for_sm_80_and_sm_90_without_spills(tmp_path, every):
    """The build of every kernel at its default configuration on both routes, ahead of time, in a process without
    the interpreter: no spills and at least 2 CTAs per SM (every configuration, degree, activation, gate and dtype:
    ``pytest -m slow``, about 15 minutes without a cache)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "kernels.json"
    res = subprocess.run([sys.executable, "-m", "polymixer", "kernels", "--arch", "sm_80", "sm_90", "--quiet",
                          "--json", str(out)] + ([] if every else ["--representative"]), capture_output=True,
                         text=True, env=env, timeout=3600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = json.loads(out.read_text())
    from polymixer.ops.value_pom import triton_kernels as vk

    assert {r["kernel"] for r in rows} >= set(tk.KERNELS) | set(vk.KERNELS)
    assert {r["arch"] for r in rows} == {"sm_80", "sm_90"}
    assert all(r["ok"] and r["spills"] == 0 and r["registers"] and r["ctas_per_sm"] >= 2 for r in rows), \
        [r for r in rows if not r["ok"] or r["spills"] or r["ctas_per_sm"] < 2]
    assert set(rows[0]) == {"op", "kernel", "config", "arch", "registers", "spills", "shared_bytes", "ctas_per_sm",
                            "ok", "error"}
    assert "per kernel and architecture" in res.stdout
    if every:  # the covering set: every degree, activation, gate and dtype built at least once
        configs = " ".join(r["config"] for r in rows if r["op"] == "pom")
        assert all(f"K={k}," in configs for k in range(1, 6)) and all(f"ACT={a}," in configs for a in range(6))
        assert all(f"GATE={g}," in configs for g in range(3))
        assert all(dt in configs for dt in ("fp32", "bf16", "fp16"))


def test_the_kernel_summary_keeps_the_worst_configuration():
    from polymixer.experiments.bench.aot import occupancy, summarise

    rows = [{"kernel": "k", "arch": "sm_90", "ok": True, "registers": 100, "spills": 0, "shared_bytes": 2048,
             "ctas_per_sm": 4},
            {"kernel": "k", "arch": "sm_90", "ok": True, "registers": 168, "spills": 8, "shared_bytes": 1024,
             "ctas_per_sm": 3},
            {"kernel": "k", "arch": "sm_90", "ok": False, "registers": None, "spills": None, "shared_bytes": None},
            {"kernel": "k", "arch": "sm_80", "ok": True, "registers": 90, "spills": 0, "shared_bytes": 0,
             "ctas_per_sm": 5}]
    s = {r["arch"]: r for r in summarise(rows)}
    assert s["sm_90"] == {"kernel": "k", "arch": "sm_90", "builds": 3, "compiled": 2, "max_registers": 168,
                          "max_spills": 8, "max_shared_kb": 2.0, "min_ctas_per_sm": 3}
    assert s["sm_80"]["builds"] == 1 and s["sm_80"]["max_registers"] == 90
    # 255 registers × 128 threads = 32,640 ≤ 32,768: two blocks; at 8 warps one; shared memory can bind too
    assert occupancy(255, 4, 0, 90) == 2 and occupancy(255, 8, 0, 90) == 1 and occupancy(64, 4, 120_000, 90) == 1


# -- the value-carrying PoM -------------------------------------------------------------------------------------


def _value_mixer(**kw) -> PoM:
    m = ValuePoM(8, degree=2, expand=2, value_dim=8, heads=2, bias=True, **kw)
    with torch.no_grad():
        m.coeff.uniform_(-1.0, 1.0)
        m.coeff_q.uniform_(-1.0, 1.0)
        m.gate_bias.normal_()
    return m


def _value_check(m: PoM, x: torch.Tensor, device: torch.device, rtol: float = 1e-5, **kw) -> None:
    """Against the oracle; on a GPU the kernels' fp32 products are tf32 (≈ 1e-3 relative), in the interpreter exact."""
    rtol = rtol if device.type == "cpu" else 5e-3

    def run(mm, xx, name, kws):
        mm.zero_grad()
        xx = xx.detach().clone().requires_grad_()
        with backend(name):
            y = mm(xx, **kws)
        y.square().sum().backward()
        return [y.detach(), xx.grad] + [p.grad.clone() for p in mm.parameters()]

    got = run(m.to(device, torch.float32), x.to(device, torch.float32), "triton", kw)
    want = run(m.cpu().double(), x.cpu().double(), "reference",
               {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()})
    for i, (a, b) in enumerate(zip(got, want)):
        err = (a.cpu().double() - b).abs().max().item() / (b.abs().max().item() + 1e-30)
        assert err <= rtol, f"output {i}: relative error {err:.2e}"


@pytest.fixture
def small_chunks(monkeypatch):
    from polymixer.ops.value_pom import triton_kernels as vk

    monkeypatch.setattr(vk, "CHUNK", 16)  # 37 tokens: three chunks


VCU = torch.tensor([0, 5, 6, 30, 37], dtype=torch.int32)
VALUE_MODES = {"causal": dict(causal=True), "block-causal (block divides the chunk)": dict(causal=True, block_size=4),
               "block-causal (block straddles chunks)": dict(causal=True, block_size=5),
               "key padding": dict(causal=True, mask=torch.rand(2, 37) > 0.3),
               "rotary": dict(causal=True), "full": {}}


@pytest.mark.parametrize("mode", ["causal", "block-causal (block straddles chunks)",
                                  pytest.param("block-causal (block divides the chunk)", marks=SLOW),
                                  pytest.param("key padding", marks=SLOW), pytest.param("rotary", marks=SLOW),
                                  pytest.param("full", marks=SLOW)])
@pytest.mark.usefixtures("traced_kernels")
def test_value_pom_modes_match_the_oracle(mode, device, small_chunks):
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in VALUE_MODES[mode].items()}
    m = _value_mixer(rope="1d" if mode == "rotary" else None)
    _value_check(m, torch.randn(2, 37, 8), device, **kw)


@pytest.mark.parametrize("mode", ["causal", "full", pytest.param("block", marks=SLOW)])
@pytest.mark.usefixtures("traced_kernels")
def test_value_pom_packed_sequences_match_the_oracle(mode, device, small_chunks):
    """Packed sequences mix in place in every mode (no padding to one length, no host synchronisation)."""
    kw = {"causal": dict(causal=True), "full": {}, "block": dict(causal=True, block_size=3)}[mode]
    mask = (torch.rand(1, 37) > 0.2).to(device)
    _value_check(_value_mixer(), torch.randn(1, 37, 8), device, cu_seqlens=VCU.to(device), mask=mask, **kw)


def test_value_pom_dispatch(device, small_chunks):
    m = _value_mixer().to(device)
    x = torch.randn(1, 20, 8, device=device)
    args = (x, m.weights)
    with backend("triton"):
        assert backend_for("value_pom", *args, causal=True, block_size=3)["backend"] == "triton"
        with pytest.raises(NotImplementedError, match="cross-mixing is not in the kernels"):
            m(x, torch.randn(1, 4, 8, device=device))
    auto = backend_for("value_pom", *args, causal=True)
    if device.type == "cpu":
        assert auto["backend"] == "torch" and "CUDA tensors only" in auto["passed_over"]["triton"]
    else:  # the kernels where a measurement of them says they are faster, else the torch form saying why
        assert auto["backend"] == "triton" or auto["passed_over"]["triton"].startswith(("no measurement",
                                                                                        "table entry"))


# -- the first-use check ------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_checks(monkeypatch):
    """The first-use checks of this test only (the process-wide record left as it was)."""
    monkeypatch.setattr(tc, "CHECKED", {})
    return tc.CHECKED


@pytest.mark.parametrize("context", ["no_grad", "inference_mode", "autocast"])
@pytest.mark.usefixtures("traced_kernels")
def test_the_first_use_check_cannot_fail_because_of_the_callers_context(context, device, fresh_checks, monkeypatch):
    """Evaluation or generate() first (no_grad / inference_mode) or a bf16 autocast region around the first call:
    the check runs in a clean context of its own and passes — in float32 and in the call's dtype."""
    monkeypatch.setattr(tk, "CHECK_SHAPE", (8, 16, 20))  # the interpreter's pace: one small mode
    monkeypatch.setattr(tk, "CHECK_MODES", ("causal",))
    ctx = {"no_grad": torch.no_grad(), "inference_mode": torch.inference_mode(),
           "autocast": torch.autocast(device.type, dtype=torch.bfloat16)}[context]
    dtype = torch.bfloat16 if context == "autocast" else torch.float32
    with ctx:
        assert tk.self_check(device, dtype) is None
    assert fresh_checks[("pom", device.type, device.index, torch.float32)] is None
    assert fresh_checks[("pom", device.type, device.index, dtype)] is None


def test_the_first_use_check_waits_out_a_cuda_graph_capture(monkeypatch, device, fresh_checks):
    """During a CUDA-graph capture nothing is run: the check answers "not yet checked" and runs at the next call."""
    monkeypatch.setattr(tc, "_capturing", lambda dev: True)
    why = tk.self_check(device)
    assert "CUDA graph is being captured" in why and not fresh_checks
    monkeypatch.setattr(tc, "_capturing", lambda dev: False)
    monkeypatch.setattr(tk, "run_check", lambda dev, dt, name="triton": None)
    assert tk.self_check(device) is None


def test_a_failing_first_use_check_is_loud_and_backend_for_repeats_it(monkeypatch, device, fresh_checks):
    """Kernels that misbehave where they first run compiled: the automatic choice warns once and runs the next
    backend, backend_for says why, an explicit choice raises the reason."""
    from polymixer.ops import dispatch

    def broken(dev, dtype, name="triton"):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(tk, "run_check", broken)
    monkeypatch.setattr(tk, "needs_check", lambda dev: True)  # checked here as on a GPU
    monkeypatch.setitem(dispatch._PRECHECKS, ("pom", "triton"), lambda call, explicit=False: None)
    m = _mixer().to(device)
    x = torch.randn(1, 6, 8, device=device)
    args = (x, m.weights)
    with pytest.warns(RuntimeWarning, match="failed their first-use check .* illegal memory access"):
        auto = backend_for("pom", *args, causal=True)
    assert auto["backend"] != "triton" and "illegal memory access" in auto["passed_over"]["triton"]
    assert backend_for("pom", *args, causal=True) == auto  # checked once
    with backend("triton"), pytest.raises(NotImplementedError, match="first-use check .* illegal memory access"):
        m(x, causal=True)


@SLOW
def test_the_first_use_checks_pass(device, fresh_checks):
    from polymixer.ops.pom import triton_gemm
    from polymixer.ops.value_pom import triton_kernels as vk

    tk.use_config(None)
    assert tk.self_check(device) is None and triton_gemm.self_check(device) is None
    assert vk.self_check(device) is None
