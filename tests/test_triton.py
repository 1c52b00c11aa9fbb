"""The Triton backend of PoM against the float64 oracle: outputs and the gradients of the input and of every
parameter, in every mode the kernels take, on tiny shapes with several chunks and channel blocks.

Without a GPU the kernels run in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``, set by conftest.py
before Triton is imported); with ``POLYMIXER_TEST_DEVICE=cuda`` they run compiled on the GPU. Skipped without
Triton (the ``[gpu]`` extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from polymixer import PoM  # noqa: E402
from polymixer.ops import backend, backend_for  # noqa: E402
from polymixer.ops.pom import triton_kernels as tk  # noqa: E402

CU = torch.tensor([0, 5, 6, 17, 21], dtype=torch.int32)  # four packed sequences, one of a single token


@pytest.fixture(autouse=True)
def small_tiles(device):
    """Chunks of 8 tokens and blocks of 8 channels: tiny inputs still cross chunks, channel blocks and sequences."""
    if device.type == "cpu" and not tk.interpreted():
        pytest.skip("CPU tensors need TRITON_INTERPRET=1 (conftest.py sets it unless POLYMIXER_TEST_DEVICE=cuda)")
    tk.use_config(tk.LaunchConfig(8, 8, 1))
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


def _check(m: PoM, x: torch.Tensor, device: torch.device, rtol: float = 1e-5, **kw) -> None:
    got = _run(m.to(device, torch.float32), x.to(device, torch.float32), "triton", **kw)
    ref_kw = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    want = _run(m.cpu().double(), x.cpu().double(), "reference", **ref_kw)
    for name, a, b in zip(("y", "dx", "dcoeff", "dbias", "dW_in", "dW_o"), got, want):
        err = (a.cpu().double() - b).abs().max().item() / (b.abs().max().item() + 1e-30)
        assert err <= rtol, f"{name}: relative error {err:.2e} > {rtol:.0e}"


SLOW = pytest.mark.slow  # the interpreter takes seconds per case: the default run keeps one case per kernel path
MODES = {
    "full": {},
    "causal": dict(causal=True),
    "block-causal (block < chunk)": dict(causal=True, block_size=3),
    "block-causal (block > chunk)": dict(causal=True, block_size=11),
}


@pytest.mark.parametrize("mode", [m if m != "block-causal (block > chunk)" else pytest.param(m, marks=SLOW)
                                  for m in MODES])
def test_modes_match_the_oracle(mode, device):
    _check(_mixer(), torch.randn(2, 21, 8), device, **MODES[mode])


@SLOW
def test_sum_reduction(device):
    _check(_mixer(reduction="sum"), torch.randn(2, 21, 8), device, causal=True)
    _check(_mixer(reduction="sum"), torch.randn(2, 21, 8), device)


@pytest.mark.parametrize("causal", [pytest.param(False, marks=SLOW), True])
def test_key_padding(causal, device):
    mask = torch.rand(2, 21) > 0.35
    mask[1, :7] = False  # a row whose first queries see nothing: H = 0, never NaN
    _check(_mixer(), torch.randn(2, 21, 8), device, causal=causal, mask=mask.to(device))


@pytest.mark.parametrize("mode", [pytest.param("full", marks=SLOW), "causal", pytest.param("block", marks=SLOW)])
def test_packed_sequences(mode, device):
    kw = {"full": {}, "causal": dict(causal=True), "block": dict(causal=True, block_size=3)}[mode]
    mask = torch.rand(1, 21) > 0.2
    _check(_mixer(), torch.randn(1, 21, 8), device, cu_seqlens=CU.to(device), mask=mask.to(device), **kw)


@pytest.mark.parametrize("causal", [pytest.param(False, marks=SLOW), True])
def test_rotary_1d(causal, device):
    _check(_mixer(rope="1d"), torch.randn(2, 21, 8), device, causal=causal)
    _check(_mixer(rope="1d"), torch.randn(1, 21, 8), device, causal=causal, cu_seqlens=CU.to(device))


def test_rotary_2d(device):
    rows, cols = torch.meshgrid(torch.arange(3), torch.arange(5), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], -1)  # a 3 × 5 grid
    _check(_mixer(rope="2d"), torch.randn(2, 15, 8), device, positions=pos.to(device))


@pytest.mark.parametrize("degree, sel_heads", [(5, 4), pytest.param(1, 1, marks=SLOW), pytest.param(2, 4, marks=SLOW),
                                               pytest.param(1, 4, marks=SLOW), pytest.param(5, 1, marks=SLOW)])
def test_degrees_and_gate_heads(degree, sel_heads, device):
    _check(_mixer(degree=degree, sel_heads=sel_heads), torch.randn(2, 13, 8), device, causal=True)


@pytest.mark.parametrize("gate, activation", [("sigmoid", "gelu")] + [
    pytest.param(g, a, marks=SLOW) for g in ("sigmoid", "identity")
    for a in ("relu", "identity", "silu", "gelu", "tanh")
    if (g, a) != ("sigmoid", "gelu")])
def test_non_linearities(gate, activation, device):
    _check(_mixer(gate=gate, activation=activation), torch.randn(2, 11, 8), device)


@pytest.mark.parametrize("n", [1, pytest.param(2, marks=SLOW), pytest.param(9, marks=SLOW)])
def test_odd_lengths(n, device):
    _check(_mixer(), torch.randn(3, n, 8), device, causal=True)
    _check(_mixer(), torch.randn(3, n, 8), device)


def test_bf16_is_within_the_torch_forms_tolerance(device):
    """bf16 activations, fp32 accumulation: the kernels stay as close to the float64 oracle as the torch form does."""
    m = _mixer().to(device)
    x = torch.randn(2, 21, 8, device=device)
    exact = _run(m.double(), x.double(), "reference", causal=True)[0]
    m = m.float()
    errs = {}
    for name in ("triton", "torch"):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            y = _run(m, x, name, causal=True)[0]
        errs[name] = (y.double() - exact).abs().max().item() / exact.abs().max().item()
    assert errs["triton"] <= 2 * errs["torch"] + 1e-3, errs


def test_deterministic(device):
    m = _mixer().to(device)
    x = torch.randn(2, 21, 8, device=device)
    a, b = _run(m, x, "triton", causal=True), _run(m, x, "triton", causal=True)
    assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_the_dispatcher_routes_and_refuses_clearly(device):
    m = _mixer().to(device)
    x = torch.randn(1, 6, 8, device=device)
    args = (x, None, m.in_proj.weight, m.gate_bias, m.coeff, m.out_proj.weight)
    with backend("triton"):
        assert backend_for("pom", *args, causal=True)["backend"] == "triton"
        with pytest.raises(NotImplementedError, match="backend 'triton' cannot take this pom call: cross-mixing"):
            m(x, torch.randn(1, 4, 8, device=device))
        with pytest.raises(NotImplementedError, match=r"explicit \(B, M, N\) mask"):
            m(x, mask=torch.ones(1, 6, 6, dtype=torch.bool, device=device))
    auto = backend_for("pom", *args, causal=True)
    if device.type == "cpu":  # the interpreter is never chosen automatically
        assert auto["backend"] == "cpu" and "CUDA tensors only" in auto["passed_over"]["triton"]
    else:
        assert auto["backend"] == "triton"


@pytest.mark.parametrize("tile", [pytest.param(t, marks=() if t == (64, False) else SLOW,
                                               id=f"{t[0]}ch{'-rope' if t[1] else ''}") for t in tk.TILES])
def test_every_launch_configuration_matches_the_oracle(tile, device):
    """The tiles the dispatcher picks on a GPU (not the tests' tiny ones): a mixer whose width selects exactly this
    tile, causal and full, over a length that crosses a chunk, against the oracle."""
    block_d, rope = tile
    block_n, warps = tk.TILES[tile]
    D = 2 * block_d if rope else block_d
    G = block_d if block_d > (32 if rope else 64) else 1  # tiles wider than the default come from a whole gate head
    tk.use_config(None)  # the dispatcher's own choice
    assert tk.launch_configs(D, G, "1d" if rope else None) == tk.LaunchConfig(block_n, block_d, warps)
    m = _mixer(D // 2, degree=2, expand=2, rope="1d" if rope else None, **({"sel_heads": D // G} if G > 1 else {}))
    x = torch.randn(1, block_n + 5, D // 2)
    for kw in (dict(causal=True), {}):
        _check(m, x, device, **kw)


@pytest.mark.parametrize("every", [False, pytest.param(True, marks=SLOW)], ids=["default-configs", "every-config"])
def test_the_kernels_build_for_sm_80_and_sm_90_without_spills(tmp_path, every):
    """The build of every kernel at its default configuration, ahead of time, in a process without the interpreter
    (every launch configuration, 228 builds: ``pytest -m slow``, about 10 minutes without a cache)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "kernels.json"
    res = subprocess.run([sys.executable, "-m", "polymixer.cli", "kernels", "--arch", "sm_80", "sm_90", "--quiet",
                          "--json", str(out)] + ([] if every else ["--representative"]), capture_output=True,
                         text=True, env=env, timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {r["kernel"] for r in rows} >= set(tk.KERNELS) and {r["arch"] for r in rows} == {"sm_80", "sm_90"}
    assert all(r["ok"] and r["spills"] == 0 and r["registers"] for r in rows), [r for r in rows if not r["ok"]]
    assert set(rows[0]) == {"op", "kernel", "config", "arch", "registers", "spills", "shared_bytes", "ok", "error"}
    assert "per kernel and architecture" in res.stdout


def test_the_kernel_summary_keeps_the_worst_configuration():
    from polymixer.ops.aot import summarise

    rows = [{"kernel": "k", "arch": "sm_90", "ok": True, "registers": 100, "spills": 0, "shared_bytes": 2048},
            {"kernel": "k", "arch": "sm_90", "ok": True, "registers": 168, "spills": 8, "shared_bytes": 1024},
            {"kernel": "k", "arch": "sm_90", "ok": False, "registers": None, "spills": None, "shared_bytes": None},
            {"kernel": "k", "arch": "sm_80", "ok": True, "registers": 90, "spills": 0, "shared_bytes": 0}]
    s = {r["arch"]: r for r in summarise(rows)}
    assert s["sm_90"] == {"kernel": "k", "arch": "sm_90", "builds": 3, "compiled": 2, "max_registers": 168,
                          "max_spills": 8, "max_shared_kb": 2.0}
    assert s["sm_80"]["builds"] == 1 and s["sm_80"]["max_registers"] == 90


# -- the value-carrying PoM -------------------------------------------------------------------------------------


def _value_mixer(**kw) -> PoM:
    m = PoM(8, degree=2, expand=2, value_dim=8, heads=2, bias=True, **kw)
    with torch.no_grad():
        m.coeff.uniform_(-1.0, 1.0)
        m.coeff_q.uniform_(-1.0, 1.0)
        m.gate_bias.normal_()
    return m


def _value_check(m: PoM, x: torch.Tensor, device: torch.device, rtol: float = 1e-5, **kw) -> None:
    """Against the oracle; on a GPU the kernels' products are tf32 (≈ 1e-3 relative), in the interpreter exact."""
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


VALUE_MODES = {"causal": dict(causal=True), "block-causal": dict(causal=True, block_size=4),
               "key padding": dict(causal=True, mask=torch.rand(2, 37) > 0.3),
               "rotary": dict(causal=True), "full": {}}


@pytest.mark.parametrize("mode", ["causal", "block-causal", pytest.param("key padding", marks=SLOW),
                                  pytest.param("rotary", marks=SLOW), pytest.param("full", marks=SLOW)])
def test_value_pom_modes_match_the_oracle(mode, device, small_chunks):
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in VALUE_MODES[mode].items()}
    m = _value_mixer(rope="1d" if mode == "rotary" else None)
    _value_check(m, torch.randn(2, 37, 8), device, **kw)


def test_value_pom_packed_causal_matches_the_oracle(device, small_chunks):
    cu = torch.tensor([0, 5, 6, 30, 37], dtype=torch.int32, device=device)
    _value_check(_value_mixer(), torch.randn(1, 37, 8), device, causal=True, cu_seqlens=cu)


def test_value_pom_dispatch(device, small_chunks):
    m = _value_mixer().to(device)
    x = torch.randn(1, 20, 8, device=device)
    with backend("triton"), pytest.raises(NotImplementedError, match="block size 3 does not divide the chunk"):
        m(x, causal=True, block_size=3)
    args = (x, None, *m.value_weights())
    assert backend_for("value_pom", *args, causal=True)["backend"] == ("triton" if device.type == "cuda" else "torch")


@SLOW
def test_the_first_use_check_passes(device):
    tk._CHECKED.pop((device.type, device.index), None)
    assert tk.self_check(device) is None


def test_a_failing_first_use_check_makes_the_dispatcher_fall_back(monkeypatch, device):
    """Kernels that misbehave where they first run compiled are caught by the check, with a warning, and the
    automatic choice runs the torch form."""
    fake = torch.device("cpu", 7)  # a key of its own
    monkeypatch.setitem(tk._CHECKED, ("cpu", 7), None)
    tk._CHECKED.pop(("cpu", 7))

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr("polymixer.ops.pom.pom", broken)
    with pytest.warns(RuntimeWarning, match="failed their first-use check .* illegal memory access"):
        why = tk.self_check(fake)
    assert "illegal memory access" in why and tk.self_check(fake) == why  # checked once
