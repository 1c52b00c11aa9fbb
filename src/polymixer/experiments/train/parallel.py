"""How the training loop spreads a run over processes, on PyTorch's own stack.

- **Data parallel** (default under torchrun): DistributedDataParallel over every rank.
- **Context parallel** (``--context-parallel C``): a 2-D DeviceMesh (data × context) — C consecutive ranks share
  each example, every one of them holding a contiguous slice of its sequence (:func:`polymixer.context_parallel`);
  the data-parallel rank picks the batch share. Gradients are still averaged over every rank (DDP or FSDP): each
  rank's loss is the mean over its slice, and the mixers' collectives carry the cross-slice gradients, so the
  average over the world is the gradient of the mean over every token of the global batch (equal slices).
- **Sharded parameters** (``--fsdp``): FSDP2 (``fully_shard``) on every block of every ``ModuleList`` and on the
  root, bf16 parameters with fp32 gradient reduction where the device autocasts to bf16. Checkpoints are sharded:
  every rank writes its own shard of the model and optimizer state with ``torch.distributed.checkpoint`` (in a
  background thread with ``--async-checkpoint``), nobody gathers the whole state, and ``dcp.load`` reshards them to
  any number of ranks — or to one process without FSDP. A resumed model is built on the meta device, sharded, and
  only its shards are materialised before they are loaded.
- **Block-wise initialisation** (every fresh ``--fsdp`` run of a family that builds its model from a preset): the
  model is built on the meta device, sharded, and each rank materialises only its shards, initialising them one
  FSDP unit (a block, then the root's own parameters) at a time from a whole copy of that unit
  (:func:`init_blockwise`): peak memory at the start is this rank's shards plus one unit. The weights are a
  function of the seed alone — the same on any number of ranks, sharded or not — and follow the model's own
  initialisation (its modules' ``reset_parameters`` and the model's ``initialize_weights``), though they are not
  the draws of building the model whole.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import torch
from torch import Tensor, nn

__all__ = ["Layout", "layout", "shard", "aliases", "no_decay_names", "full_model_state", "full_optimizer_state",
           "load_optimizer_state", "by_names", "check_supported", "OPTIMIZER_FQN", "OPTIMIZER_DCP", "sharded_state",
           "save_sharded", "own_shard_files", "load_sharded", "to_meta", "materialise", "reshard", "is_sharded_model",
           "is_meta", "units", "init_weights", "init_blockwise"]

OPTIMIZER_FQN = "fqn"  # trainer_state["optimizer_format"] of a state keyed by parameter names (FSDP runs)
OPTIMIZER_DCP = "dcp"  # the optimizer state is in the checkpoint's sharded/ folder, beside the model's


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
    from torch.distributed.fsdp import register_fsdp_forward_method

    for name in ("forward_with_cfg",):  # methods called in place of forward (sampling) gather the root's parameters
        if callable(getattr(model, name, None)):
            register_fsdp_forward_method(model, name)


def is_sharded_model(model: nn.Module) -> bool:
    """Whether the model's parameters are sharded (DTensors: FSDP2)."""
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def reshard(model: nn.Module) -> None:
    """Free every gathered parameter of a sharded model (the root keeps its own gathered after a forward without
    backward, e.g. an evaluation), so that each rank holds its shard alone again."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def to_meta(model: nn.Module) -> Dict[str, Tensor]:
    """Put the model's parameters on the meta device in place (tied ones stay tied, ``requires_grad`` kept), freeing
    their memory before sharding; returns a copy of every buffer (:func:`materialise` puts them back, since
    ``to_empty`` leaves buffers uninitialised and buffers are not in every state dict)."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    made: Dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in made:
                made[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
            module._parameters[name] = made[id(p)]
    return buffers


def materialise(model: nn.Module, device: torch.device, buffers: Dict[str, Tensor]) -> None:
    """Allocate a (sharded) model built on the meta device on ``device`` — each rank only its shards, uninitialised
    until loaded — and put its buffers back."""
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])


def is_meta(model: nn.Module) -> bool:
    """Whether the model was built on the meta device (its tensors allocate nothing yet)."""
    return any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))


def units(model: nn.Module) -> List[str]:
    """The names of the modules :func:`shard` makes FSDP units: every element of every ``ModuleList``, then the root
    (``""``), which owns the parameters of no block."""
    names = {id(m): n for n, m in model.named_modules()}
    blocks = [names[id(b)] for m in model.modules() if isinstance(m, nn.ModuleList) for b in m]
    return list(dict.fromkeys(blocks)) + [""]


def _post_order(module: nn.Module) -> Any:
    for child in module.children():
        yield from _post_order(child)
    yield module


def init_weights(model: nn.Module) -> None:
    """The model's own initialisation, run again: every module's ``reset_parameters`` children first (as a
    constructor runs its children's before overriding them), then the model's ``initialize_weights``. On a model
    built on the meta device it sets only the tensors materialised: an op on a meta tensor does nothing and draws no
    random number."""
    with torch.no_grad():
        for module in _post_order(model):
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()
        if callable(getattr(model, "initialize_weights", None)):
            model.initialize_weights()


def _owner(name: str, unit_names: List[str]) -> str:
    """The unit a parameter or buffer of that name belongs to: the innermost block holding it, else the root."""
    return max((u for u in unit_names if u and name.startswith(u + ".")), key=len, default="")


def _slots(model: nn.Module) -> Dict[int, List[Tuple[Dict[str, Any], str]]]:
    """Every place (a module's ``_parameters`` or ``_buffers`` and the key) each tensor sits, by ``id`` (a tied
    tensor sits in several)."""
    out: Dict[int, List[Tuple[Dict[str, Any], str]]] = {}
    for m in model.modules():
        for table in (m._parameters, m._buffers):
            for key, t in table.items():
                if t is not None:
                    out.setdefault(id(t), []).append((table, key))
    return out


def _unset(dtype: torch.dtype) -> Any:
    """What no initialisation leaves in a tensor of ``dtype`` (NaN, the lowest integer; False for booleans)."""
    if dtype.is_floating_point:
        return float("nan")
    return False if dtype == torch.bool else torch.iinfo(dtype).min


def _blank(t: Tensor, device: torch.device) -> Tensor:
    """A whole copy of ``t``'s shape on ``device`` filled with :func:`_unset`, so that a tensor no initialisation
    reaches is found."""
    out = torch.full(t.shape, _unset(t.dtype), dtype=t.dtype, device=device)
    return nn.Parameter(out, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else out


def _left_unset(t: Tensor) -> bool:
    """Whether some element of ``t`` still holds :func:`_unset` (a float's sum is NaN then: no mask allocated)."""
    if t.dtype.is_floating_point:
        return bool(t.sum().isnan())
    return t.dtype != torch.bool and bool((t == _unset(t.dtype)).any())


def _keep_shard(dst: Tensor, full: Tensor) -> None:
    """Copy this rank's part of ``full`` into ``dst``: its shard of a sharded parameter, else the whole. FSDP2's
    shard is a ``torch.chunk`` of one dimension over the ranks: copied from a view, nothing allocated."""
    if type(dst).__name__ != "DTensor":
        dst.copy_(full)
        return
    (placement,) = dst.placements
    if not placement.is_shard():
        from torch.distributed.tensor import distribute_tensor

        dst.copy_(distribute_tensor(full, dst.device_mesh, dst.placements, src_data_rank=None))
        return
    rank, chunks = dst.device_mesh.get_local_rank(), torch.chunk(full, dst.device_mesh.size(), dim=placement.dim)
    dst.to_local().copy_(chunks[rank] if rank < len(chunks) else full.narrow(placement.dim, 0, 0))


def init_blockwise(model: nn.Module, template: nn.Module, seed: int, device: torch.device) -> None:
    """Materialise and initialise ``model``, built on the meta device and possibly sharded since, one FSDP unit at a
    time (:func:`units`): ``template`` (a copy of the meta model made before sharding) gets that unit's own tensors
    whole on ``device``, :func:`init_weights` runs on it, and each rank keeps its shard of each tensor
    (the whole where the model is not sharded), then the unit goes back to the meta device. Peak memory: this rank's
    shards plus one unit. The random draws are seeded with ``seed`` in a stream of their own (the caller's generators
    are left as they were). A tensor no initialisation reached is a one-line ValueError naming it."""
    tied = aliases(model)
    model.to_empty(device=device)
    for name, first in tied.items():  # (materialising gives each place of a tied parameter its own tensor)
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner)._parameters[attr] = model.get_parameter(first)
    names = units(template)
    slots = _slots(template)
    tensors = {**dict(template.named_parameters()), **dict(template.named_buffers())}
    targets = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    forked = [torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked), torch.no_grad():
        torch.manual_seed(seed)
        for unit in names:
            own = {n: t for n, t in tensors.items() if _owner(n, names) == unit}
            whole = {n: _blank(t, device) for n, t in own.items()}
            for n, t in own.items():
                for table, key in slots[id(t)]:
                    table[key] = whole[n]
            init_weights(template)
            for n, t in whole.items():
                if _left_unset(t):
                    raise ValueError(f"{n} is set by no reset_parameters of its module nor by the model's "
                                     f"initialize_weights: the model cannot be initialised on the meta device")
                _keep_shard(targets[n], t)
            for n, t in own.items():  # the unit back on the meta device: its memory freed
                for table, key in slots[id(t)]:
                    table[key] = t
            del whole  # (before the next unit's are made)


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

    sharded = is_sharded_model(model)
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


def sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """``{"model": …, "optimizer": …}``: this rank's shards of both, keyed by parameter names (no gather; a plain
    model's whole state). Loading into it in place and then :func:`load_sharded`'s set fills model and optimizer."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}


def save_sharded(state: Dict[str, Any], folder: Path, group: Any = None, background: bool = False) -> Any:
    """Every rank writes its shards of ``state`` into ``folder`` (a collective; the first rank adds the metadata).
    ``background``: ``dcp.async_save`` — the state is copied to CPU memory before this returns, the files are written
    by a thread, and the future it returns completes once every rank's files and the metadata are written. That
    thread runs its collectives on ``group``, which must not be the group training uses (on gloo two threads' calls
    on one group would interleave): a gloo group made for checkpoints."""
    import torch.distributed.checkpoint as dcp

    if background:
        fut = dcp.async_save(state, checkpoint_id=str(folder), process_group=group)
        return getattr(fut, "upload_completion", fut)
    dcp.save(state, checkpoint_id=str(folder))
    return None


def own_shard_files(folder: Path, rank: int) -> List[str]:
    """The files of ``folder`` this rank wrote (DCP names them ``__<rank>_<n>.distcp``), sorted: each rank checksums
    its own, in parallel; the manifest's writer hashes whatever no rank claimed (the metadata)."""
    return sorted(f.name for f in Path(folder).iterdir() if f.is_file() and f.name.startswith(f"__{rank}_"))


def load_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load a sharded checkpoint's model and optimizer state, resharded to this layout: into a sharded model every
    rank reads the pieces of its own shards (a collective); into a plain model this process reads everything alone."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    sharded = is_sharded_model(model)
    state = sharded_state(model, optimizer)
    with warnings.catch_warnings():  # (DCP says it assumes one process: that is what no_dist asks)
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(folder), no_dist=not sharded)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def check_supported(fsdp: bool, ema: float, sam_rho: float) -> Optional[Tuple[str, str]]:
    """(flag, why) for an option the sharded or context-parallel loop does not run, else None."""
    if fsdp and ema > 0:
        return "--ema", "the EMA copy of the weights is not sharded: run --fsdp without --ema"
    if fsdp and sam_rho > 0:
        return "--sam-rho", "sharpness-aware minimisation is not run on sharded parameters"
    return None
