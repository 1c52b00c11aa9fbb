"""One op, several backends: which implementation runs a call, and how a user chooses.

Each op (``pom``, ``value_pom``, ``gated_value_pom``) has a front end that validates a call once into a
:class:`polymixer.ops.call.Call` (its weights one object of the op's type, the mode keywords one
:class:`polymixer.ops.common.Mixing`, a stream's state) and backends side by side, each a module with
``supports(call) -> None | str`` (None when it can take the call, else the reason it cannot) and ``forward(call)``;
a backend never calls another one (what they share is a module of its own). An op that lacks a backend says why
(:func:`absent`):

* ``reference`` — the float64 oracle, the paper's formula literally (an explicit visibility matrix: O(M·N));
* ``torch`` — the device-agnostic modular form (every device, every mode, ``torch.compile``);
* ``cpu`` — the fused, cache-tiled CPU path of the hot modes;
* ``triton`` — the GPU kernels between cuBLAS projections (CUDA tensors; CPU tensors too under
  ``TRITON_INTERPRET=1``, for testing);
* ``triton_gemm`` — the same kernels with the input projection inside them (z never written).

The automatic choice tries ``triton_gemm``, ``triton``, ``cpu``, then ``torch`` — the first that takes the call —
and never picks ``reference``. It never takes a slower path: a Triton route registered with a speed rule
(:func:`polymixer.ops.measured.rule`) is taken only where its rules (:mod:`polymixer.ops.measured`) find it faster
than the torch form — measured on this kind of call and kernel code, or modelled from measured bandwidth. The rule
runs after the backend's own checks (``supports``, the first-use check included): a route that cannot take a call
says so first.

The Triton backends are custom ops, so they are chosen inside ``torch.compile`` too; they are imported with the op's
package when they could run (a GPU, or the interpreter), because dynamo cannot trace an import.
``with polymixer.backend("cpu"):`` makes a choice explicit, in the style of ``torch.nn.attention.sdpa_kernel``: an
explicit choice is strict — it raises ``NotImplementedError`` naming the case it cannot take, and ignores the speed
rules. :func:`backend_for` says which backend a call would get, by which rule, and why the others were passed over;
the logger ``polymixer.ops`` says the same at DEBUG level for every call.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from types import ModuleType
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from .common import is_compiling

__all__ = ["BACKENDS", "AUTO_ORDER", "backend", "current_backend", "choose", "backend_for", "disabled_backends",
           "load_backend", "register", "absent"]

log = logging.getLogger("polymixer.ops")

BACKENDS = ("reference", "torch", "cpu", "triton", "triton_gemm")
AUTO_ORDER = ("triton_gemm", "triton", "cpu", "torch")

# op → backend → its module, or the module's name while it is not imported yet (the Triton backends: imported only
# when a call could run on them). Each op's package registers its backends (:func:`register`).
_MODULES: Dict[str, Dict[str, Union[str, ModuleType]]] = {}
# a check run before a lazy backend is imported (e.g. the Triton backends look at the device first, so that a CPU
# call never imports Triton): (op, name) → call → None or why not
_PRECHECKS: Dict[Tuple[str, str], Any] = {}
# the speed rule of a route in the automatic choice: (op, name) → call → polymixer.ops.measured.Verdict
_SPEED: Dict[Tuple[str, str], Any] = {}
# why an op has no such backend: (op, name) → reason
_ABSENT: Dict[Tuple[str, str], str] = {}

# the explicit choice (a stack: nested ``backend()`` blocks) and the backends switched off for the automatic one
_STATE: Dict[str, Any] = {"forced": [], "disabled": frozenset()}


@contextlib.contextmanager
def backend(name: str) -> Iterator[None]:
    """Run every op inside the block on backend ``name`` ("reference", "torch", "cpu", "triton"). Strict: a call
    the backend cannot take raises ``NotImplementedError`` saying why, instead of falling back."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; the backends are {', '.join(BACKENDS)}")
    _STATE["forced"].append(name)
    try:
        yield
    finally:
        _STATE["forced"].pop()


def current_backend() -> Optional[str]:
    """The explicitly chosen backend (the innermost ``backend()`` block), or None: the automatic choice."""
    forced = _STATE["forced"]
    return forced[-1] if forced else None


@contextlib.contextmanager
def disabled_backends(*names: str) -> Iterator[None]:
    """Leave ``names`` out of the automatic choice inside the block (e.g. to compare the fused CPU path with the
    modular one on the same inputs)."""
    bad = [n for n in names if n not in BACKENDS]
    if bad:
        raise ValueError(f"unknown backend(s) {bad}; the backends are {', '.join(BACKENDS)}")
    previous = _STATE["disabled"]
    _STATE["disabled"] = previous | frozenset(names)
    try:
        yield
    finally:
        _STATE["disabled"] = previous


def register(op: str, name: str, module: Union[str, ModuleType], precheck: Any = None, eager: bool = False,
             speed: Any = None) -> None:
    """Make ``module`` (or the module of that name, imported on first use — now when ``eager``) backend ``name`` of
    ``op``; ``precheck(call, explicit)`` (None or why not) runs before a lazy module is imported; ``speed(call)``
    (a :class:`polymixer.ops.measured.Verdict`) decides whether the automatic choice takes the route at all."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; the backends are {', '.join(BACKENDS)}")
    if eager and isinstance(module, str):
        try:
            module = importlib.import_module(module)
        except ImportError as e:  # Triton not installed: the reason is given where a call could have used it
            log.debug("backend %s of %s not imported: %s", name, op, e)
    _MODULES.setdefault(op, {})[name] = module
    if precheck is not None:
        _PRECHECKS[(op, name)] = precheck
    if speed is not None:
        _SPEED[(op, name)] = speed


def absent(op: str, name: str, why: str) -> None:
    """Say why ``op`` has no backend ``name`` (in the error of an explicit choice and in ``backend_for``)."""
    _ABSENT[(op, name)] = why


def _missing(op: str, name: str) -> str:
    why = _ABSENT.get((op, name))
    return f"backend {name!r} has no {op}" + (f" ({why})" if why else "")


def load_backend(op: str, name: str) -> Optional[ModuleType]:
    """The module of backend ``name`` of ``op`` (None when the op has no such backend). Under ``torch.compile`` a
    backend not imported yet is not imported (dynamo does not trace imports): ImportError."""
    target = _MODULES[op].get(name)
    if target is None or isinstance(target, ModuleType):
        return target
    if is_compiling():
        raise ImportError("not imported before torch.compile traced this call")
    module = importlib.import_module(target)
    _MODULES[op][name] = module
    return module


# what a probe of the automatic choice found: (why not, or None; the speed rule's verdict, where the route has one)
_Probe = Tuple[Optional[str], Any]


def _reasons(op: str, call: Any) -> Tuple[Optional[str], List[Tuple[str, str]], Any]:
    """(the backend the automatic choice takes, [(backend, why not) for those passed over], the speed rule's verdict
    on the one taken, or None where it has no rule)."""
    passed: List[Tuple[str, str]] = []
    for name in AUTO_ORDER:
        if name not in _MODULES[op]:
            if (op, name) in _ABSENT:
                passed.append((name, _ABSENT[(op, name)]))
            continue
        if name in _STATE["disabled"]:
            passed.append((name, "switched off"))
            continue
        why, verdict = _probe_auto(op, name, call)
        if why is None:
            return name, passed, verdict
        passed.append((name, why))
    return None, passed, None


def _probe_auto(op: str, name: str, call: Any) -> _Probe:
    """The automatic choice's probe: the strict probe (the precheck, then the backend's ``supports`` with its
    first-use check), then the route's speed rule — so that a route that cannot take the call says so first, and a
    route that could is taken only where it is worth taking."""
    why = _probe(op, name, call)
    if why is not None:
        return why, None
    speed = _SPEED.get((op, name))
    if speed is None:
        return None, None
    verdict = speed(call)
    return (None if verdict.taken else f"{verdict.rule}: {verdict.reason}"), verdict


def _probe(op: str, name: str, call: Any, explicit: bool = False) -> Optional[str]:
    """Why backend ``name`` cannot take ``call`` (None: it can): its precheck, then its module's ``supports``."""
    pre = _PRECHECKS.get((op, name))
    why = pre(call, explicit) if pre is not None else None
    if why is not None:
        return why
    try:
        module = load_backend(op, name)
    except ImportError as e:  # Triton not installed: the [gpu] extra
        return f"not installed ({e})"
    assert module is not None
    return module.supports(call)


def choose(op: str, call: Any) -> ModuleType:
    """The backend module that runs ``call`` of ``op``: the explicit choice (strict) or the automatic one."""
    forced = current_backend()
    if forced is not None:
        if forced not in _MODULES[op]:
            raise NotImplementedError(f"{_missing(op, forced)}; its backends are {', '.join(_MODULES[op])}")
        why = _probe(op, forced, call, explicit=True)
        if why is not None:
            raise NotImplementedError(f"backend {forced!r} cannot take this {op} call: {why}")
        return load_backend(op, forced)  # type: ignore[return-value]
    name, passed, verdict = _reasons(op, call)
    if name is None:  # the torch form takes every call: only a bug gets here
        raise NotImplementedError(f"no backend can take this {op} call: " + "; ".join(f"{n}: {w}" for n, w in passed))
    if not is_compiling() and log.isEnabledFor(logging.DEBUG):
        taken = f" ({verdict.rule}: {verdict.reason})" if verdict is not None else ""
        log.debug("%s on %s%s%s", op, name, taken, "".join(f"; {n} passed over: {w}" for n, w in passed))
    return load_backend(op, name)  # type: ignore[return-value]


def backend_for(op: str, call: Any) -> Dict[str, Any]:
    """Which backend a call of ``op`` gets and why: {"backend": name, "explicit": bool, "rule": the speed rule that
    let the automatic choice take it ("table entry" or "model"; None for an explicit choice or a backend without
    one), "reason": that rule's reason, "passed_over": {name: why}} — a route its speed rule passed over says which
    rule ("table entry", "model" or "no measurement") and why (the ``call`` as the op's front end builds it)."""
    forced = current_backend()
    if forced is not None:
        why = _probe(op, forced, call, explicit=True) if forced in _MODULES[op] else _missing(op, forced)
        return {"backend": forced if why is None else None, "explicit": True, "rule": None, "reason": None,
                "passed_over": {} if why is None else {forced: why}}
    name, passed, verdict = _reasons(op, call)
    return {"backend": name, "explicit": False, "rule": None if verdict is None else verdict.rule,
            "reason": None if verdict is None else verdict.reason, "passed_over": dict(passed)}
