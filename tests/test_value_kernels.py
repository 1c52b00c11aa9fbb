"""The value PoM's Triton kernels (``polymixer.ops.value_pom.triton_kernels``) at the level of their op, against a
float64 oracle with an explicit visibility matrix: the output and the gradients of q, k and v in every mode (causal,
full, block-causal with blocks that divide a chunk, straddle chunks or outlast them, each packed), in fp32, bf16 and
fp16; fp16 states past fp16's range; strided inputs taken without copies; the launches (parallel over chunks, each
kernel once, no score product formed twice); the states' dtype; the refusal of fp32 under "highest" on CUDA; the
ahead-of-time builds' coverage; the kernel-bench hook.

Tiles are forced small (chunks of 16 tokens, channel blocks of 16, scan steps of 2 chunks over 64 state elements), so
that tiny inputs cross chunks, key and value blocks, scan steps and element blocks. Without a GPU the kernels run in
Triton's interpreter on CPU tensors (conftest.py sets ``TRITON_INTERPRET=1``); the whole-layer tests of the value
PoM are in tests/test_triton.py and tests/test_kernel_ops.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import List, Optional

import pytest
import torch

pytest.importorskip("triton")

from polymixer.ops import triton_common as tc  # noqa: E402
from polymixer.ops.call import Call  # noqa: E402
from polymixer.ops.value_pom import ValuePomWeights  # noqa: E402
from polymixer.ops.value_pom.call import make_value_call  # noqa: E402
from polymixer.ops.value_pom import triton_kernels as vk  # noqa: E402

SLOW = pytest.mark.slow
CU = torch.tensor([0, 5, 6, 32, 37, 70], dtype=torch.int32)  # starts inside chunks, one at a chunk edge (32)
MODES = {"causal": (0, 1), "full": (1, 1), "block 4 (divides the chunk)": (2, 4),
         "block 5 (straddles chunks)": (2, 5), "block 37 (longer than a chunk)": (2, 37)}


@pytest.fixture(autouse=True)
def small_tiles(device):
    if device.type == "cpu" and not tc.interpreted():
        pytest.skip("CPU tensors need TRITON_INTERPRET=1 (conftest.py sets it unless POLYMIXER_TEST_DEVICE=cuda)")
    with vk.use_tiles(chunk=16, block=16, scan_chunks=2, scan_width=64):
        yield


def _seqid(cu: torch.Tensor, n: int) -> torch.Tensor:
    return (torch.searchsorted(cu.long(), torch.arange(n), right=True) - 1).to(torch.int32)


def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: Optional[torch.Tensor], mode: int,
           bs: int) -> torch.Tensor:
    """Σ_{j visible to i} (q_i · k_j) v_j in float64 with an explicit (N × N) visibility matrix."""
    N = q.shape[2]
    n = torch.arange(N)
    sid = torch.zeros(N, dtype=torch.long) if cu is None else _seqid(cu, N).long()
    s0 = torch.zeros(N, dtype=torch.long) if cu is None else cu.long()[sid]
    same = sid[:, None] == sid[None, :]
    before = n[None, :] <= n[:, None]
    group = (n - s0) // bs
    vis = {0: same & before, 1: same, 2: same & (before | (group[:, None] == group[None, :]))}[mode]
    scores = torch.einsum("bhid,bhjd->bhij", q.double(), k.double()) * vis.double()
    return torch.einsum("bhij,bhje->bhie", scores, v.double())


def _inputs(B: int, H: int, N: int, DK: int, DV: int, dtype: torch.dtype, scale: float = 1.0) -> List[torch.Tensor]:
    """q, k, v, do rounded to ``dtype`` (the oracle sees the same values)."""
    return [(torch.randn(B, H, N, d) * scale).to(dtype) for d in (DK, DK, DV, DV)]


def _kernels(q, k, v, do, cu, mode, bs, device) -> List[torch.Tensor]:
    """(o, dq, dk, dv) of the op on ``device``."""
    leaves = [t.to(device).detach().requires_grad_() for t in (q, k, v)]
    packed = (cu.to(device), _seqid(cu, q.shape[2]).to(device)) if cu is not None else (None, None)
    o = vk.value_mix_op(*leaves, *packed, mode, bs)
    o.backward(do.to(device))
    return [o.detach().cpu()] + [t.grad.cpu() for t in leaves]


def _want(q, k, v, do, cu, mode, bs) -> List[torch.Tensor]:
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o = oracle(*leaves, cu, mode, bs)
    o.backward(do.double())
    return [o.detach()] + [t.grad for t in leaves]


def _assert_close(got: List[torch.Tensor], want: List[torch.Tensor], rtol: float) -> None:
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        assert torch.isfinite(a).all(), name
        err = (a.double() - b).abs().max().item() / (b.abs().max().item() + 1e-30)
        assert err <= rtol, f"{name}: relative error {err:.2e} > {rtol:.0e}"


def _rtol(device: torch.device, dtype: torch.dtype) -> float:
    """Exact fp32 in the interpreter; tf32 on a GPU; bf16 / fp16 round the scores, the states (bf16) and outputs."""
    if dtype == torch.bfloat16:
        return 3e-2
    if dtype == torch.float16:
        return 2e-3
    return 1e-5 if device.type == "cpu" else 5e-3


@pytest.mark.parametrize("mode", ["causal", "block 5 (straddles chunks)", pytest.param("full", marks=SLOW),
                                  pytest.param("block 4 (divides the chunk)", marks=SLOW),
                                  pytest.param("block 37 (longer than a chunk)", marks=SLOW)])
def test_every_mode_matches_the_oracle(mode, device):
    """Two rows of 50 tokens (4 chunks, 2 scan steps), two heads of 32 key (two blocks) and 24 value channels (two
    blocks, one partial): output and gradients in fp32 against the oracle."""
    m, bs = MODES[mode]
    q, k, v, do = _inputs(2, 2, 50, 32, 24, torch.float32)
    _assert_close(_kernels(q, k, v, do, None, m, bs, device), _want(q, k, v, do, None, m, bs),
                  _rtol(device, torch.float32))


@SLOW
def test_two_runs_are_bit_identical(device):
    """Nothing is atomic: the same inputs give the same bits, output and gradients."""
    q, k, v, do = _inputs(1, 2, 70, 32, 24, torch.float32)
    first = _kernels(q, k, v, do, CU, 2, 5, device)
    assert all(torch.equal(a, b) for a, b in zip(first, _kernels(q, k, v, do, CU, 2, 5, device)))


@pytest.mark.parametrize("mode", ["block 5 (straddles chunks)", pytest.param("causal", marks=SLOW),
                                  pytest.param("full", marks=SLOW)])
def test_packed_sequences_match_the_oracle(mode, device):
    """Five packed sequences of 70 tokens: starts inside chunks and at a chunk edge, a one-token sequence, a sequence
    over three chunks and two scan steps; the states restart at every start."""
    m, bs = MODES[mode]
    q, k, v, do = _inputs(1, 2, 70, 32, 24, torch.float32)
    got = _kernels(q, k, v, do, CU, m, bs, device)
    _assert_close(got, _want(q, k, v, do, CU, m, bs), _rtol(device, torch.float32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=SLOW)])
@pytest.mark.parametrize("mode", ["causal", pytest.param("block 5 (straddles chunks)", marks=SLOW)])
def test_16_bit_features_match_the_oracle(dtype, mode, device):
    """bf16 (bf16 states) and fp16 (fp32 states, tf32 products with them) against the oracle of the same rounded
    inputs; the gradients come back in the features' dtype."""
    m, bs = MODES[mode]
    q, k, v, do = _inputs(1, 2, 70, 32, 24, dtype)
    got = _kernels(q, k, v, do, CU, m, bs, device)
    assert all(t.dtype == dtype for t in got)
    _assert_close(got, _want(q, k, v, do, CU, m, bs), _rtol(device, dtype))


def test_fp16_states_past_fp16_range_stay_finite(device):
    """An unnormalised state of 80 tokens of keys and values ≈ 32 passes fp16's 65,504 (the sum here is ≈ 87,000);
    the fp16 kernels keep fp32 states, so outputs and gradients are finite and equal to the fp32 run within fp16's
    rounding (queries and the incoming gradient small enough for the outputs themselves to fit fp16)."""
    N, D = 80, 16
    k = (32 + torch.rand(1, 1, N, D)).half()
    v = (32 + torch.rand(1, 1, N, D)).half()
    q = (torch.rand(1, 1, N, D) / 1024).half()
    do = (torch.rand(1, 1, N, D) / 1024).half()
    state = torch.einsum("bhnd,bhne->bhde", k.double(), v.double())
    assert state.max() > torch.finfo(torch.float16).max  # the premise: an fp16 state would overflow
    for m, bs in ((0, 1), (1, 1)):
        got = _kernels(q, k, v, do, None, m, bs, device)
        want = _kernels(q.float(), k.float(), v.float(), do.float(), None, m, bs, device)
        _assert_close(got, [w.double() for w in want], 5e-3)


# -- layouts and launches ----------------------------------------------------------------------------------------


@pytest.fixture
def launches(monkeypatch):
    """Every launch of the op bodies: (kernel name, grid, tensor arguments); the kernels still run."""
    seen: List[tuple] = []
    real = vk.launch

    def record(kernel, grid, *args, **kwargs):
        seen.append((kernel.__name__, tuple(grid), [a for a in args if isinstance(a, torch.Tensor)]))
        real(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(vk, "launch", record)
    return seen


def test_strided_features_are_taken_without_copies(device, launches):
    """q, k and v as the torch form makes them — heads views of (B, N, H·D) projections, v a slice of the fused key /
    value projection — and a permuted incoming gradient reach the kernels as they are (no copy), give the results
    of contiguous inputs bit for bit, and the outputs come back in (B, N, H, D) memory order."""
    B, N, H, DK, DV = 2, 40, 2, 16, 16
    heads = lambda t, d: t.view(B, N, H, d).transpose(1, 2)  # noqa: E731
    kv = torch.randn(B, N, H * (DK + DV), device=device)
    k, v = (heads(t, d) for t, d in zip(kv.split([H * DK, H * DV], dim=-1), (DK, DV)))
    q = heads(torch.randn(B, N, H * DK, device=device), DK)
    do = torch.randn(N, B, H, DV, device=device).permute(1, 2, 0, 3)  # any strides with adjacent channels
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = vk.value_mix_op(*leaves, None, None, 0, 1)
    o.backward(do)
    assert o.stride() == (N * H * DV, DV, H * DV, 1)
    fed = {t.data_ptr() for _, _, tensors in launches for t in tensors}
    assert {q.data_ptr(), k.data_ptr(), v.data_ptr(), do.data_ptr()} <= fed
    plain = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    o2 = vk.value_mix_op(*plain, None, None, 0, 1)
    o2.backward(do.contiguous())
    assert torch.equal(o, o2) and all(torch.equal(a.grad, b.grad) for a, b in zip(leaves, plain))


@pytest.fixture
def no_launch(monkeypatch):
    """Launches that do nothing: the op bodies run on meta tensors (layouts and grids, no values)."""
    seen: List[tuple] = []
    monkeypatch.setattr(vk, "launch", lambda kernel, grid, *a, **k: seen.append(
        (kernel.__name__, tuple(grid), [t for t in a if isinstance(t, torch.Tensor)])))
    return seen


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_every_pass_is_parallel_over_chunks_and_no_score_product_is_formed_twice(mode, no_launch):
    """Forward: local sums over (row·head, chunk, key × value block), the scan over (row·head, element block,
    state buffer), outputs over (row·head, chunk). Backward: the states and their gradients' local sums, one scan of
    every buffer, dv and (dq, dk) once each over (row·head, chunk) — the scores q kᵀ (in dv) and do vᵀ (in dq / dk)
    formed once per chunk, for every channel block."""
    B, H, N, DK, DV = 2, 3, 100, 32, 48
    meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731
    q, k, v = meta(B, H, N, DK), meta(B, H, N, DK), meta(B, H, N, DV)
    o = vk._mix(q, k, v, None, None, mode, 3)
    vk._mix_backward(torch.empty_like(o), q, k, v, None, None, mode, 3)
    NC, E = -(-N // 16), DK * DV
    local, scan, chunks = (B * H, NC, 2 * 3), (B * H, -(-E // 64)), (B * H, NC)
    ends = 1 + (mode != 0)
    assert [(name, grid) for name, grid, _ in no_launch] == [
        ("_states_kernel", local), ("_scan_kernel", scan + (ends,)), ("_output_kernel", chunks),
        ("_states_kernel", local), ("_dstates_kernel", local), ("_scan_kernel", scan + (2 * ends,)),
        ("_dv_kernel", chunks), ("_dqk_kernel", chunks)]


@pytest.mark.parametrize("dtype, states", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
                                           (torch.float32, torch.float32)])
def test_the_states_are_bf16_only_for_bf16_features(dtype, states, no_launch):
    """bf16 features: states accumulated in fp32, stored bf16. fp16: fp32 states (fp16's range is too small for an
    unnormalised state). fp32: fp32."""
    q = torch.empty(1, 2, 50, 32, dtype=dtype, device="meta")
    vk._mix(q, q, q, None, None, 1, 1)
    tables = {t.dtype for name, _, ts in no_launch if name == "_scan_kernel" for t in ts[:1]}
    assert tables == {states}
    assert vk.state_dtype(dtype) == states


def test_tiles_per_dtype_and_the_forced_small_ones(monkeypatch):
    """bf16 takes channel blocks of up to BLOCK (64); fp32 and fp16, whose states are fp32, up to BLOCK_F32 (32:
    wider fp32 state tiles spill registers); use_tiles forces smaller ones for tests and restores the others after."""
    for name, value in (("CHUNK", 64), ("BLOCK", 64), ("BLOCK_F32", 32)):
        monkeypatch.setattr(vk, name, value)
    assert vk._tiles(128, 128, None, torch.bfloat16) == (64, 64, 64, 4)
    assert vk._tiles(128, 128, None, torch.float32) == vk._tiles(128, 128, None, torch.float16) == (64, 32, 32, 4)
    assert vk._tiles(8, 24, None, torch.bfloat16) == (64, 16, 32, 4)
    assert vk.default_tiles() == (64, 64, 64, 4) and vk.default_tiles(torch.float32) == (64, 32, 32, 4)
    saved = (vk.CHUNK, vk.SM80_CHUNK, vk.BLOCK, vk.BLOCK_F32, vk.SCAN_CHUNKS, vk.SCAN_WIDTH)
    with vk.use_tiles(chunk=32, block=16, scan_chunks=4, scan_width=32):
        assert vk._tiles(128, 128, None, torch.float32) == (32, 16, 16, 4)
        assert (vk.SCAN_CHUNKS, vk.SCAN_WIDTH) == (4, 32)
    assert (vk.CHUNK, vk.SM80_CHUNK, vk.BLOCK, vk.BLOCK_F32, vk.SCAN_CHUNKS, vk.SCAN_WIDTH) == saved


# -- the backend's refusals --------------------------------------------------------------------------------------


def _call(x) -> Call:
    """A validated causal call of 2 heads, its input then swapped for ``x`` (a stand-in for a CUDA tensor)."""
    D, dv, d = 16, 8, 8
    w = lambda *s: torch.zeros(*s)  # noqa: E731
    weights = ValuePomWeights(in_weight=w(2 * D + dv + dv, d), gate_bias=w(dv), coeff=w(D, 2), coeff_q=w(D, 2),
                              shift_weight=None, norm_weight=w(dv), out_weight=w(d, dv))
    call = make_value_call(torch.zeros(1, 20, d), weights, None, dict(causal=True), heads=2)
    return dataclasses.replace(call, x=x)


@pytest.fixture
def precision():
    saved = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(saved)


def test_fp32_under_highest_is_refused_on_cuda(monkeypatch, precision):
    """On CUDA tensors, fp32 operands with tf32 forbidden would make every product a full-fp32 CUDA-core product:
    refused with the reason (a bf16 layer hands the kernels bf16 operands: taken). Allowing tf32 takes the call (its
    first-use check stubbed here); CPU tensors under the interpreter still run under "highest"."""
    monkeypatch.setattr(vk, "self_check", lambda device, dtype=torch.float32: None)
    cuda_x = SimpleNamespace(dtype=torch.float32, device=torch.device("cuda"), shape=(1, 20, 8))
    precision("highest")
    why = vk.supports(_call(cuda_x))
    assert why is not None and "'highest'" in why and "tf32" in why
    bf16_x = SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cuda"), shape=(1, 20, 8))
    assert vk.supports(_call(bf16_x)) is None  # a bf16 layer's operands reach the kernels in bf16
    precision("high")
    assert vk.supports(_call(cuda_x)) is None
    precision("highest")
    assert vk.supports(_call(torch.zeros(1, 20, 8))) is None


def test_the_kernels_still_run_under_highest_on_cpu(device, precision):
    """The refusal is for CUDA tensors only: the interpreter's kernels run, exact, under "highest"."""
    precision("highest")
    q, k, v, do = _inputs(1, 1, 20, 16, 16, torch.float32)
    _assert_close(_kernels(q, k, v, do, None, 0, 1, device), _want(q, k, v, do, None, 0, 1),
                  _rtol(device, torch.float32))


# -- ahead-of-time builds and the bench hook ---------------------------------------------------------------------


def test_the_aot_builds_cover_every_kernel_at_every_launch_tile():
    """``polymixer kernels`` builds every kernel for sm_80 and sm_90 at each architecture's chunk and every tile the
    launches pick: bf16 and fp32 at all of theirs, fp16 at its default; the scan over bf16 and fp32 states."""
    from polymixer.experiments.bench.aot import Build

    builds = vk.aot_builds(Build)
    have = {(b.kernel, b.dtype, b.archs, dict(b.constexprs).get("C"), dict(b.constexprs).get("BK"),
             dict(b.constexprs).get("BV")) for b in builds}
    for arch, chunk in ((80, vk.SM80_CHUNK), (90, vk.CHUNK)):
        for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
            for _, bk, bv, _ in vk.launch_tiles(dtype):
                for kernel in set(vk.KERNELS) - {"value_scan"}:
                    assert (kernel, name, (arch,), chunk, bk, bv) in have
        _, bk, bv, _ = vk.default_tiles(torch.float16)
        assert all((kernel, "fp16", (arch,), chunk, bk, bv) in have for kernel in set(vk.KERNELS) - {"value_scan"})
        assert {b.dtype for b in builds if b.kernel == "value_scan" and b.archs == (arch,)} == {"bf16", "fp32"}
    assert all(b.maxnreg == vk.MAXNREG and b.num_warps == 4 for b in builds)


@pytest.mark.parametrize("mode", ["causal", "full", pytest.param("block", marks=SLOW)])
def test_the_bench_hook_launches_every_kernel_and_counts_its_bytes(mode, device):
    """``bench_kernels``: one entry per kernel of a forward and a backward call, each closure launches it, and the
    bytes are its reads and writes of per-token tensors (B·H·N per channel) and of the states (B·H·NC·DK·DV per
    buffer), as counted here from the shapes."""
    B, N, H, DK, DV = 1, 40, 2, 16, 32
    entries = vk.bench_kernels(B, N, H, DK, DV, mode, torch.float32, device)
    names = [name for name, _, _ in entries]
    assert names == ["value_states (forward)", "value_scan (forward)", "value_output", "value_states (backward)",
                     "value_dstates", "value_scan (backward)", "value_dv", "value_dqk"]
    tok, NC = B * H * N * 4, -(-N // 16)
    state = B * H * NC * DK * DV * 4 * (1 if mode == "causal" else 2)  # h (and r), fp32 for fp32 features
    want = {"value_states (forward)": tok * (DK + DV) + state, "value_scan (forward)": 2 * state,
            "value_output": tok * (2 * DK + 2 * DV) + state, "value_states (backward)": tok * (DK + DV) + state,
            "value_dstates": tok * (DK + DV) + state, "value_scan (backward)": 4 * state,
            "value_dv": tok * (2 * DK + 2 * DV) + state, "value_dqk": tok * (4 * DK + 2 * DV) + 2 * state}
    for name, run, nbytes in entries:
        run()
        assert nbytes == want[name] > 0, name
    with pytest.raises(ValueError, match="mode must be one of"):
        vk.bench_kernels(B, N, H, DK, DV, "sideways", torch.float32, device)


def test_the_op_passes_torch_library_opcheck(device):
    """The custom op's schema, fake implementation (strides included) and autograd registration agree with the
    real one (``torch.library.opcheck``)."""
    q, k, v, _ = _inputs(1, 2, 20, 16, 16, torch.float32)
    args = tuple(t.to(device).requires_grad_() for t in (q, k, v)) + (None, None, 2, 3)
    torch.library.opcheck(vk.value_mix_op, args, test_utils=("test_schema", "test_faketensor",
                                                             "test_autograd_registration"))


@pytest.mark.usefixtures("traced_kernels")
def test_a_bf16_layer_hands_the_kernels_bf16_operands(device, monkeypatch):
    """The polynomial features are computed in fp32, but a layer under bf16 autocast hands the kernels bf16 q, k and
    v — bf16 tensor-core products and bf16 states, half the bytes of fp32 — and stays within bf16's rounding of the
    float64 oracle (as close as the torch form in bf16 is)."""
    from polymixer import ValuePoM
    from polymixer.ops import backend

    seen: List[torch.dtype] = []
    real = vk.value_mix_op

    def spy(q, k, v, *rest):
        seen.extend((q.dtype, k.dtype, v.dtype))
        return real(q, k, v, *rest)

    monkeypatch.setattr(vk, "value_mix_op", spy)
    m = ValuePoM(8, degree=2, expand=2, value_dim=8, heads=2, bias=True).to(device)
    x = torch.randn(2, 37, 8, device=device)
    with backend("reference"):
        exact = m.double()(x.double(), causal=True)
    m = m.float()
    errs = {}
    for name in ("triton", "torch"):
        with torch.autocast(device.type, dtype=torch.bfloat16), backend(name):
            y = m(x, causal=True)
        errs[name] = ((y.double() - exact).abs().max() / exact.abs().max()).item()
    assert seen and set(seen) == {torch.bfloat16}
    assert errs["triton"] <= 2 * errs["torch"] + 1e-2, errs
