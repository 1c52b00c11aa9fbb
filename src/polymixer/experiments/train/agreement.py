"""Before the first step, the ranks of a torchrun job check that they build the same model with the same settings.

A rank whose model differs — one block fewer, another width, parameters of another dtype, another autocast dtype —
would otherwise run different collectives from the others: gloo aborts somewhere obscure, NCCL hangs until its
timeout or reduces garbage. One all-gather of a fingerprint (a few int64s: hashes of the family and preset, the
device type, the autocast dtype, the settings that steer the collectives, the length of every block list, every
parameter's name, shape and dtype, the model config, and the parameter count) finds any difference at once; only
then every rank gathers the facts themselves and raises the same one-line ValueError, naming the first rank that
differs from rank 0 and what differs (``rank 1 builds 3 blocks in 'blocks' (rank 0: 4)``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["SETTINGS", "model_facts", "fingerprint", "describe_difference", "check_same_model"]

# the training settings every rank must share: each steers which collectives run, and when
SETTINGS = ("steps", "batch_size", "grad_accum", "context_parallel", "fsdp", "activation_checkpointing", "log_every",
            "eval_every", "ckpt_every", "stop_after", "sam_rho", "ema", "async_checkpoint")

# the facts in the order a difference is reported (the first that differs is named)
ORDER = ("model", "device", "autocast", "settings", "lists", "parameters", "config", "numel")


def _dtype_name(dtype: Optional[torch.dtype]) -> str:
    names = {None: "fp32", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
             torch.float64: "fp64"}
    return names.get(dtype, str(dtype).replace("torch.", ""))


def model_facts(model: nn.Module, model_config: Dict[str, Any], cfg: Any, amp: Optional[torch.dtype],
                device: torch.device) -> Dict[str, Any]:
    """What this rank builds and runs, as JSON-able values: family / preset, device type, autocast dtype, the
    :data:`SETTINGS` of ``cfg``, the length of every ``nn.ModuleList`` / ``nn.ModuleDict`` (the blocks), every
    parameter's (name, shape, dtype), the model config and the parameter count."""
    params = [(name, list(p.shape), _dtype_name(p.dtype)) for name, p in model.named_parameters()]
    return {
        "model": f"{model_config.get('family')}/{model_config.get('preset')}",
        "device": device.type,
        "autocast": _dtype_name(amp),
        "settings": {name: getattr(cfg, name) for name in SETTINGS if hasattr(cfg, name)},
        "lists": {name or "(model)": len(m) for name, m in model.named_modules()
                  if isinstance(m, (nn.ModuleList, nn.ModuleDict))},
        "parameters": params,
        "config": json.loads(json.dumps(model_config.get("model", {}), sort_keys=True, default=str)),
        "numel": sum(p.numel() for p in model.parameters()),
    }


def _hash(value: Any) -> int:
    text = json.dumps(value, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)


def fingerprint(facts: Dict[str, Any]) -> torch.Tensor:
    """The facts as int64s, one hash per fact (in :data:`ORDER`) and the parameter count."""
    return torch.tensor([_hash(facts[k]) for k in ORDER] + [len(facts["parameters"]), facts["numel"]],
                        dtype=torch.int64)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _lists(r: int, mine: Dict[str, int], first: Dict[str, int]) -> Optional[str]:
    for name in list(first) + [n for n in mine if n not in first]:
        a, b = mine.get(name), first.get(name)
        if a == b:
            continue
        if a is None:
            return f"rank {r} has no {name!r} (rank 0: {b} blocks)"
        if b is None:
            return f"rank {r} builds {a} blocks in {name!r} (rank 0: none)"
        return f"rank {r} builds {a} block{'s' if a != 1 else ''} in {name!r} (rank 0: {b})"
    return None


def _parameters(r: int, mine: Sequence[Sequence[Any]], first: Sequence[Sequence[Any]]) -> Optional[str]:
    have = {p[0]: p for p in mine}
    ref = {p[0]: p for p in first}
    for name, shape, dtype in first:
        if name not in have:
            return f"parameter {name} missing on rank {r}"
        if list(have[name][1]) != list(shape):
            return f"parameter {name} has shape {tuple(have[name][1])} on rank {r} (rank 0: {tuple(shape)})"
        if have[name][2] != dtype:
            return f"parameter {name} is {have[name][2]} on rank {r} (rank 0: {dtype})"
    extra = next((p[0] for p in mine if p[0] not in ref), None)
    return None if extra is None else f"parameter {extra} on rank {r} only (rank 0 has none)"


def _detail(r: int, mine: Dict[str, Any], first: Dict[str, Any]) -> str:
    """What differs between rank ``r``'s facts and rank 0's, the first fact of :data:`ORDER` that does."""
    if mine["model"] != first["model"]:
        return f"rank {r} builds {mine['model']} (rank 0: {first['model']})"
    if mine["device"] != first["device"]:
        return f"rank {r} runs on {mine['device']} (rank 0: {first['device']})"
    if mine["autocast"] != first["autocast"]:
        return f"rank {r} autocasts to {mine['autocast']} (rank 0: {first['autocast']})"
    for name, value in first["settings"].items():
        if mine["settings"].get(name) != value:
            return f"rank {r} runs with {_flag(name)} {mine['settings'].get(name)} (rank 0: {value})"
    found = _lists(r, mine["lists"], first["lists"]) or _parameters(r, mine["parameters"], first["parameters"])
    if found:
        return found
    for key in sorted(set(first["config"]) | set(mine["config"])):
        if mine["config"].get(key) != first["config"].get(key):
            return f"rank {r} builds {key} = {mine['config'].get(key)!r} (rank 0: {first['config'].get(key)!r})"
    return f"rank {r} has {mine['numel']:,} parameters (rank 0: {first['numel']:,})"


def describe_difference(every: Sequence[Dict[str, Any]]) -> Optional[str]:
    """The one line every rank raises, given every rank's facts (rank order); None when they all agree."""
    first = every[0]
    for r, mine in enumerate(every[1:], start=1):
        if any(_hash(mine[k]) != _hash(first[k]) for k in ORDER):
            return f"the ranks do not build the same model: {_detail(r, mine, first)} — every rank must run the " \
                   f"same command"
    return None


def check_same_model(model: nn.Module, model_config: Dict[str, Any], cfg: Any, amp: Optional[torch.dtype],
                     device: torch.device, group: Any = None) -> None:
    """Raise the same ValueError on every rank of ``group`` (default: the world) when they do not build the same
    model with the same settings (:func:`model_facts`): one all-gather of the :func:`fingerprint`, and only when
    they differ, one of the facts themselves. Every rank must call it (a collective)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    facts = model_facts(model, model_config, cfg, amp, device)
    mine = fingerprint(facts).to(device if dist.get_backend(group) == "nccl" else "cpu")
    prints: List[torch.Tensor] = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(prints, mine, group=group)
    if all(torch.equal(p, prints[0]) for p in prints):
        return
    every: List[Any] = [None] * len(prints)
    dist.all_gather_object(every, facts, group=group)
    raise ValueError(describe_difference(every) or "the ranks do not build the same model")
