"""Activation checkpointing: trade compute for memory so that activations, not weights, stop bounding the sequence.

At long context a linear-time model's memory is its activations: O(N·d) per layer, kept from the forward for the
backward. ``--activation-checkpointing`` keeps less of them:

- ``block``: each block keeps only its input; its forward runs again during the backward (one extra forward per
  step) — activation memory of one block plus the blocks' inputs instead of every block's intermediates.
- ``selective``: op-level selective checkpointing: inside each block the outputs of the matrix products (``mm``,
  ``addmm``, ``bmm``, ``baddbmm``, convolutions, SDPA) are kept, everything else — elementwise ops, norms,
  activations — is recomputed. This suits PoM: its polynomial features (the Horner polynomial of the projected
  tokens, the gating, the running sums) are cheap elementwise passes over tensors the projections produce, while
  its projections are the FLOPs. Keeping the GEMM outputs and recomputing the elementwise passes saves most of the
  activation memory for a fraction of ``block``'s extra compute.

The blocks are the elements of the model's ``nn.ModuleList`` (and ``nn.ModuleDict``) containers that hold no such
container themselves — the blocks FSDP shards (a points model's stage holds a list of blocks: the blocks are
checkpointed, not the stage). Wrapping keeps the module tree and every parameter's name: the block's class is
swapped for a subclass whose ``forward`` runs the original one under ``torch.utils.checkpoint.checkpoint``
(``use_reentrant=False``), as FSDP2 swaps classes itself — so checkpoints, optimizer state and ``lr_scale`` names are
the same with and without it, and FSDP2's ``fully_shard`` applied afterwards unshards the parameters before the
recomputation (its pre-backward hook). Apply it before sharding and before ``torch.compile``.

Exactness: the recomputation replays the RNG (dropout, drop-path), the autocast state, and the context-parallel
context of the forward (a block run under :func:`polymixer.ops.parallel.local` is recomputed local even when the
backward runs inside the context, and the other way round); running statistics of batch norms, updated by the
forward, are restored after each recomputation so that they advance once per step. The context-parallel
collectives inside a recomputed block run again in the backward, on every rank of the group in the same order (the
graph is the same on every rank), so gradients stay exact.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from ...ops import parallel as cp_ops

__all__ = ["MODES", "check_mode", "blocks_of", "apply_activation_checkpointing", "checkpointed_mode",
           "selective_policy", "SAVED_OPS"]

MODES: Tuple[str, ...] = ("none", "block", "selective")


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`MODES`, else a one-line ValueError naming the option and the choices."""
    if mode not in MODES:
        raise ValueError(f"activation_checkpointing (--activation-checkpointing) must be none, block or selective, "
                         f"got {mode!r}")
    return mode


def _saved_ops() -> Tuple[Any, ...]:
    """The matrix products whose outputs ``selective`` keeps (the overloads this build of PyTorch has)."""
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "baddbmm", "linear", "convolution", "_scaled_mm",
             "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_fused_attention_overrideable")
    return tuple(getattr(aten, n).default for n in names if hasattr(aten, n))


SAVED_OPS: Tuple[Any, ...] = _saved_ops()


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """The policy of ``selective``: keep the matrix products' outputs, recompute every other op."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> Tuple[Any, Any]:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(selective_policy)


def blocks_of(model: nn.Module) -> List[nn.Module]:
    """The blocks activation checkpointing wraps: every element of every ``nn.ModuleList`` / ``nn.ModuleDict`` of
    ``model`` that holds no such container itself, in module order."""
    containers = (nn.ModuleList, nn.ModuleDict)
    out: List[nn.Module] = []
    seen = set()
    for module in model.modules():
        if not isinstance(module, containers):
            continue
        children = module.values() if isinstance(module, nn.ModuleDict) else module
        for child in children:
            if id(child) in seen or any(isinstance(m, containers) for m in child.modules()):
                continue
            seen.add(id(child))
            out.append(child)
    return out


def _running_stats(module: nn.Module) -> List[Tuple[nn.Module, str, torch.Tensor]]:
    """(module, name, buffer) of the buffers a forward updates in place: running statistics of batch norms in
    training mode (and their counters)."""
    return [(m, name, b) for m in module.modules() if getattr(m, "track_running_stats", False) and m.training
            for name, b in m.named_buffers(recurse=False) if b is not None]


def _context_as_at(forward_context: Optional[cp_ops.ContextParallel]) -> Any:
    """A context manager that makes the context-parallel context active now the one active at the forward."""
    now = cp_ops.active()
    if now is forward_context:
        return contextlib.nullcontext()
    if forward_context is None:
        return cp_ops.local()
    same = {k: getattr(forward_context, k) for k in ("lengths", "check") if getattr(forward_context, k, None)}
    return cp_ops.context_parallel(forward_context.group, **same)


class _Replay:
    """The block's forward as the checkpoint calls it: the first call is the forward itself, every later one a
    recomputation during the backward, run in the forward's context-parallel context and on spare copies of the
    running statistics (swapped in and out by name, no tensor op: selective checkpointing replays the forward's
    ops one for one), so that the statistics advance once per forward."""

    def __init__(self, module: nn.Module, forward: Callable[..., Any]) -> None:
        self.module, self.forward, self.calls = module, forward, 0
        self.context = cp_ops.active()
        self.spares: List[Tuple[nn.Module, str, torch.Tensor]] = []

    def keep_spares(self) -> None:
        """After the forward (outside the checkpoint's contexts): copies of the running statistics for the
        recomputation to update instead of the real ones."""
        self.spares = [(m, name, b.detach().clone()) for m, name, b in _running_stats(self.module)]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            return self.forward(*args, **kwargs)
        real = [(m, name, getattr(m, name)) for m, name, _ in self.spares]
        for m, name, spare in self.spares:
            setattr(m, name, spare)
        try:
            with _context_as_at(self.context):
                return self.forward(*args, **kwargs)
        finally:  # (also when the checkpoint stops the recomputation early, by an exception)
            for m, name, b in real:
                setattr(m, name, b)


class _Checkpointed(nn.Module):
    """Mixed in before a block's own class: its ``forward`` under ``torch.utils.checkpoint`` (without reentry)."""

    ac_mode: str

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        inner = super().forward
        if not torch.is_grad_enabled():  # evaluation: nothing is kept for a backward anyway
            return inner(*args, **kwargs)
        extra: Dict[str, Any] = {"context_fn": _selective_contexts} if self.ac_mode == "selective" else {}
        if torch.compiler.is_compiling():  # compiled: the partitioner recomputes (buffer updates stay in the forward)
            return checkpoint(inner, *args, use_reentrant=False, **extra, **kwargs)
        replay = _Replay(self, inner)
        out = checkpoint(replay, *args, use_reentrant=False, **extra, **kwargs)
        replay.keep_spares()
        return out


_CLASSES: Dict[type, type] = {}


def _checkpointed_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Checkpointed{cls.__name__}", (_Checkpointed, cls), {"__module__": cls.__module__})
    return _CLASSES[cls]


def checkpointed_mode(module: nn.Module) -> str:
    """``block`` / ``selective`` for a block :func:`apply_activation_checkpointing` wrapped, else ``none``."""
    return getattr(module, "ac_mode", "none") if isinstance(module, _Checkpointed) else "none"


def apply_activation_checkpointing(model: nn.Module, mode: str) -> int:
    """Checkpoint every block of ``model`` (:func:`blocks_of`) in place with ``mode`` (:data:`MODES`); returns the
    number of blocks wrapped (0 for ``none``). Parameter and buffer names are unchanged. A block wrapped before
    takes the new mode. A model with no blocks is refused (one line)."""
    if check_mode(mode) == "none":
        return 0
    from torch.distributed.fsdp import FSDPModule

    if any(isinstance(m, FSDPModule) for m in model.modules()):
        raise ValueError("activation checkpointing must be applied before FSDP sharding")
    blocks = blocks_of(model)
    if not blocks:
        raise ValueError(f"--activation-checkpointing {mode}: {type(model).__name__} keeps no blocks in an "
                         f"nn.ModuleList or nn.ModuleDict to checkpoint")
    for block in blocks:
        if not isinstance(block, _Checkpointed):
            block.__class__ = _checkpointed_class(type(block))
        block.ac_mode = mode
    return len(blocks)
