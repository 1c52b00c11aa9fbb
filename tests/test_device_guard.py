"""Every kernel launch and the first-use check run under the CUDA device of the call's tensors.

Triton launches on the *current* CUDA device, whatever pointers it is handed. On a data-parallel rank whose tensors
live on ``cuda:1`` the current device is 1 in the rank's own thread, but the first-use check runs in a fresh thread,
whose current device is 0 — so without a guard its kernels would run on GPU 0 with GPU 1's pointers. Without a
second GPU this is simulated: a fake "current device" (per thread, 0 in a fresh thread, as CUDA's is) that the guard
(:func:`polymixer.ops.triton_common.device_guard`, replaced here by a recorder) sets, and launches that record the
current device they ran under."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, List, Optional

import pytest
import torch

pytest.importorskip("triton")

from polymixer import PoM, ValuePoM  # noqa: E402
from polymixer.ops import backend  # noqa: E402
from polymixer.ops import triton_common as tc  # noqa: E402


class _FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it lives on ``cuda:1`` (what a rank's tensor would say)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 1)


class _Devices:
    """A fake current CUDA device per thread (``cuda:0`` in a fresh thread) and a guard that sets it."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.entered: List[Optional[torch.device]] = []

    @property
    def current(self) -> torch.device:
        return getattr(self._local, "device", torch.device("cuda", 0))

    @current.setter
    def current(self, device: torch.device) -> None:
        self._local.device = device

    @contextlib.contextmanager
    def guard(self, device: Optional[torch.device]) -> Iterator[None]:
        self.entered.append(device)
        if device is None:
            yield
            return
        before = self.current
        self.current = device
        try:
            yield
        finally:
            self.current = before


@pytest.fixture
def devices(monkeypatch) -> _Devices:
    """The fake devices in place of the real guard (no GPU here; the real guard is a no-op on CPU tensors)."""
    fake = _Devices()
    monkeypatch.setattr(tc, "device_guard", fake.guard)  # raises on code that has no guard
    return fake


@pytest.fixture
def launches(monkeypatch, devices: _Devices) -> List[torch.device]:
    """The fake current device at every Triton launch (the real launch still runs after it)."""
    seen: List[torch.device] = []
    real = torch.library.wrap_triton

    def wrap(kernel: Any) -> Any:
        class _Grid:
            def __getitem__(self, grid: Any) -> Any:
                def run(*args: Any, **kwargs: Any) -> Any:
                    seen.append(devices.current)
                    if not any(isinstance(a, _FakeCudaTensor) for a in args):
                        return real(kernel)[grid](*args, **kwargs)
                    return None

                return run

        return _Grid()

    monkeypatch.setattr(torch.library, "wrap_triton", wrap)
    return seen


def test_the_real_guard_enters_the_device_of_cuda_tensors_only():
    assert isinstance(tc.device_guard(torch.device("cpu")), contextlib.nullcontext)
    assert isinstance(tc.device_guard(None), contextlib.nullcontext)
    assert isinstance(tc.device_guard(torch.device("cuda")), contextlib.nullcontext)  # no index: the current one
    guard = tc.device_guard(torch.device("cuda", 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert tc.tensor_device((3, torch.zeros(1)), {}) == torch.device("cpu")
    assert tc.tensor_device((3,), {"out": torch.zeros(1, device="meta")}) == torch.device("meta")
    assert tc.tensor_device((3,), {}) is None


def test_a_launch_runs_under_its_tensors_device(devices, launches):
    """The current device is 0; the tensors are on cuda:1: the launch runs with cuda:1 current, and the current
    device is 0 again after it."""
    x = torch.zeros(4).as_subclass(_FakeCudaTensor)
    tc.launch(object(), (1,), x, 4, BLOCK=4)
    assert devices.entered == [torch.device("cuda", 1)]
    assert launches == [torch.device("cuda", 1)]
    assert devices.current == torch.device("cuda", 0)


def test_the_first_use_check_runs_under_the_calls_device(monkeypatch, devices, launches):
    """A rank on cuda:1 (current device 1 in its own thread) meets the first-use check: the check's fresh thread
    starts on device 0, and must enter cuda:1 before it creates a tensor or launches a kernel."""
    monkeypatch.setattr(tc, "CHECKED", {})
    monkeypatch.setattr(tc, "_capturing", lambda dev: False)  # a CPU build of torch cannot ask CUDA
    devices.current = torch.device("cuda", 1)  # the rank's thread
    inside: List[torch.device] = []

    def check(device: torch.device, dtype: torch.dtype) -> None:
        inside.append(devices.current)
        tc.launch(object(), (1,), torch.zeros(2).as_subclass(_FakeCudaTensor), 2)

    assert tc.first_use("probe", torch.device("cuda", 1), torch.float32, check) is None
    assert inside == [torch.device("cuda", 1)], inside
    assert launches == [torch.device("cuda", 1)]
    assert devices.current == torch.device("cuda", 1)  # the caller's thread is left as it was


@pytest.mark.usefixtures("traced_kernels")
@pytest.mark.parametrize("value", [False, True], ids=["pom", "value_pom"])
def test_every_kernel_of_both_ops_launches_through_the_guard(value, device, devices, launches):
    """Forward and backward of PoM and the value PoM on their kernels: every launch went through
    :func:`~polymixer.ops.triton_common.launch` and ran under its tensors' device (here the CPU, under the
    interpreter; the fake current device starts as cuda:0)."""
    if device.type != "cpu":
        pytest.skip("the fake devices stand in for a second GPU on the CPU")
    m = ValuePoM(8, degree=2, heads=2) if value else PoM(8, degree=2)
    x = torch.randn(1, 12, 8, requires_grad=True)
    with backend("triton"):
        m(x, causal=True).square().sum().backward()
    assert launches, "no kernel ran"
    assert set(launches) == {torch.device("cpu")}, launches
    assert devices.current == torch.device("cuda", 0)
