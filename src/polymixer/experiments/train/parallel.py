"""How the training loop spreads a run over processes, on PyTorch's own stack.

- **Data parallel** (default under torchrun): DistributedDataParallel over every rank.
- **Context parallel** (``--context-parallel C``): a 2-D DeviceMesh (data × context) — C consecutive ranks share
  each example, every one of them holding a contiguous slice of its sequence (:func:`polymixer.context_parallel`);
  the data-parallel rank picks the batch share. Gradients are still averaged over every rank (DDP or FSDP): each
  rank's loss is the mean over its slice, and the mixers' collectives carry the cross-slice gradients, so the
  average over the world is the gradient of the mean over every token of the global batch (equal slices).
- **Sharded parameters** (``--fsdp``): FSDP2 (``fully_shard``) on every block of every ``ModuleList`` and on the
  root, bf16 parameters with fp32 gradient reduction where the device autocasts to bf16. Checkpoints stay one
  verified folder: the full weights and optimizer state are gathered through ``torch.distributed.checkpoint``'s
  state-dict API (every rank takes part, the first writes) and loaded back the same way, so a run saved on 4 ranks
  resumes on 2, on 1, or without FSDP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

import torch
from torch import Tensor, nn

__all__ = ["Layout", "layout", "shard", "aliases", "no_decay_names", "full_model_state", "full_optimizer_state",
           "load_optimizer_state", "by_names", "check_supported", "OPTIMIZER_FQN"]

OPTIMIZER_FQN = "fqn"  # trainer_state["optimizer_format"] of a state keyed by parameter names (FSDP runs)


@dataclass
class Layout:
    """Where this rank sits: ``dp_rank`` of ``dp_world`` batch shares, ``cp_rank`` of ``cp_size`` slices of each
    sequence, and the context-parallel group (a 1-D DeviceMesh, None without context parallelism)."""

    dp_rank: int = 0
    dp_world: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    cp_mesh: Any = None


def layout(rank: int, world: int, cp_size: int, device: torch.device) -> Layout:
    """The data × context layout of ``world`` ranks (context-parallel groups of consecutive ranks)."""
    if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
        raise ValueError(f"context_parallel must be a positive int, got {cp_size!r}")
    if world % cp_size:
        raise ValueError(f"--context-parallel {cp_size} must divide the number of processes ({world})")
    if cp_size == 1:
        return Layout(rank, world)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (world // cp_size, cp_size), mesh_dim_names=("dp", "cp"))
    return Layout(mesh["dp"].get_local_rank(), world // cp_size, mesh["cp"].get_local_rank(), cp_size, mesh["cp"])


def aliases(model: nn.Module) -> Dict[str, str]:
    """{name: the name it shares its parameter with} for tied parameters (e.g. an LM head tied to the embedding)."""
    seen: Dict[int, str] = {}
    out: Dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            out[name] = seen[id(p)]
        else:
            seen[id(p)] = name
    return out


def no_decay_names(model: nn.Module) -> Set[str]:
    """Names of the parameters marked ``no_weight_decay`` (sharding replaces the parameter objects and drops the
    mark, so the optimizer is told by name)."""
    return {n for n, p in model.named_parameters() if getattr(p, "no_weight_decay", False)}


def shard(model: nn.Module, bf16: bool) -> None:
    """FSDP2 in place: ``fully_shard`` every element of every ``ModuleList`` (the blocks), then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else \
        MixedPrecisionPolicy()
    for module in list(model.modules()):
        if isinstance(module, nn.ModuleList):
            for block in module:
                fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)


def _options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kw)


def full_model_state(model: nn.Module) -> Dict[str, Tensor]:
    """The whole model's weights as plain CPU tensors (a collective: every rank calls it), without the names of
    tied parameters (the checkpoint's loader restores them)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    sd = get_model_state_dict(model, options=_options())
    for name in aliases(model):
        sd.pop(name, None)
    return sd


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """The optimizer state keyed by parameter names, whole, on CPU (a collective)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options())


def _names_in_order(model: nn.Module, optimizer: torch.optim.Optimizer) -> List[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: Dict[str, Any],
                         fmt: Optional[str]) -> None:
    """Load a checkpoint's optimizer state whatever wrote it: a plain ``optimizer.state_dict()`` (one process or
    DDP, keyed by position) or a state keyed by names (FSDP), into a plain or a sharded model."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    sharded = any(type(p).__name__ == "DTensor" for p in model.parameters())
    if fmt != OPTIMIZER_FQN:
        if not sharded:
            optimizer.load_state_dict(state)
            return
        state = by_names(state, _names_in_order(model, optimizer))
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=_load_options())


def _load_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True)


def by_names(state: Dict[str, Any], names: List[str]) -> Dict[str, Any]:
    """A positional ``optimizer.state_dict()`` re-keyed by parameter names (the order of ``names``)."""
    ids = [i for g in state["param_groups"] for i in g["params"]]
    if len(ids) != len(names):
        raise ValueError(f"the checkpoint's optimizer holds {len(ids)} parameters, this model {len(names)}")
    of = dict(zip(ids, names))
    return {"state": {of[i]: s for i, s in state["state"].items()},
            "param_groups": [{**g, "params": [of[i] for i in g["params"]]} for g in state["param_groups"]]}


def check_supported(fsdp: bool, ema: float, sam_rho: float) -> Optional[Tuple[str, str]]:
    """(flag, why) for an option the sharded or context-parallel loop does not run, else None."""
    if fsdp and ema > 0:
        return "--ema", "the EMA copy of the weights is not sharded: run --fsdp without --ema"
    if fsdp and sam_rho > 0:
        return "--sam-rho", "sharpness-aware minimisation is not run on sharded parameters"
    return None
