"""The registry of model presets (timm-style): ``create_model(name, **overrides)``, ``list_models()``.

Each family's model file (``models/<family>.py``, or a module of the package that added the family) registers named
presets: a config dataclass holding every hyper-parameter, and a constructor. Overrides are fields of that
dataclass; ``device="meta"`` builds the module without allocating a single weight (parameter counting of
paper-scale presets). Family names are those of the families table; a family's earlier names are accepted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fnmatch
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Union

import torch
from torch import nn

from ..blocks import check_mixer_options
from ..families import canonical_family
from ..families import family as family_entry

__all__ = ["register_model", "create_model", "list_models", "model_config", "build_from_config", "count_parameters",
           "ModelEntry", "preset_of", "current_fields", "current_name", "family_config", "check_overrides"]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    family: str
    config_cls: type
    defaults: Dict[str, Any]
    builder: Callable[[Any], nn.Module]
    description: str = ""


_REGISTRY: Dict[str, ModelEntry] = {}
_FAMILIES: Dict[str, tuple] = {}


def register_model(name: str, family: str, config_cls: type, builder: Callable[[Any], nn.Module],
                   description: str = "", **defaults: Any) -> None:
    """Register a preset: ``name`` builds ``builder(config_cls(**defaults, **overrides))``."""
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is already registered")
    family = family_entry(family).name
    _REGISTRY[name] = ModelEntry(name, family, config_cls, dict(defaults), builder, description)
    _FAMILIES[family] = (config_cls, builder)


def current_name(config_cls: type, name: str) -> str:
    """Today's name of a config field given under ``name`` (its earlier name, as the class's ``RENAMED`` lists it, or
    itself)."""
    return getattr(config_cls, "RENAMED", {}).get(name, name)


def current_fields(config_cls: type, values: Dict[str, Any]) -> Dict[str, Any]:
    """``values`` (config fields by name) with each field's earlier name replaced by today's, as the config class
    lists them in ``RENAMED`` (``{"shift_width": "token_shift"}``): checkpoints, bench variants and commands written
    with an earlier name keep working. Both names at once is a ValueError."""
    renamed = getattr(config_cls, "RENAMED", {})
    out = dict(values)
    for old, new in renamed.items():
        if old in out:
            if new in out:
                raise ValueError(f"{old} is the earlier name of {config_cls.__name__}.{new}: give only {new}")
            out[new] = out.pop(old)
    return out


def family_config(family: str) -> type:
    """The model-config dataclass of a family (LMConfig, DiTConfig, …)."""
    family = canonical_family(family)
    if family not in _FAMILIES:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(sorted(_FAMILIES))}")
    return _FAMILIES[family][0]


def list_models(pattern: Optional[str] = None, family: Optional[str] = None) -> List[str]:
    """Registered preset names, optionally filtered by a glob pattern and a family."""
    family = None if family is None else canonical_family(family)
    names = [n for n, e in _REGISTRY.items() if family is None or e.family == family]
    return sorted(n for n in names if pattern is None or fnmatch.fnmatch(n, pattern))


def model_config(name: str, **overrides: Any) -> Any:
    """The config dataclass of a preset with overrides applied (unknown fields raise a TypeError naming them)."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model {name!r}{hint} (see polymixer.models.list_models())")
    entry = _REGISTRY[name]
    overrides = current_fields(entry.config_cls, overrides)
    valid = {f.name for f in dataclasses.fields(entry.config_cls)}
    bad = sorted(set(overrides) - valid)
    if bad:
        raise TypeError(f"{', '.join(bad)} {'is not a field' if len(bad) == 1 else 'are not fields'} of "
                        f"{entry.config_cls.__name__}; valid overrides: {', '.join(sorted(valid))}")
    return entry.config_cls(**{**entry.defaults, **overrides})


def check_overrides(name: str, overrides: Dict[str, Any]) -> Any:
    """:func:`model_config` of what a user sets over preset ``name`` (``polymixer train --set``), refusing a mixer
    option set away from the preset's value that no layer of the model takes: it would change nothing. (A config
    itself holds such fields: the options of layers :func:`polymixer.pomify` may give the model later, one size that
    a bench gives every model it compares, every field of a saved checkpoint.)"""
    config, preset = model_config(name, **overrides), model_config(name)
    check_mixer_options(config.layer_pattern(), {k: v for k, v in current_fields(type(config), overrides).items()
                                                 if k in config.MIXER_OPTIONS and v != getattr(preset, k)})
    return config


def build_from_config(family: str, config: Union[Dict[str, Any], Any], device: Optional[Union[str, torch.device]] = None
                      ) -> nn.Module:
    """Rebuild a model of ``family`` from its config (a dataclass or the dict saved in a checkpoint)."""
    config_cls, builder = family_config(family), _FAMILIES[canonical_family(family)][1]
    if isinstance(config, dict):
        config = current_fields(config_cls, config)
        valid = {f.name for f in dataclasses.fields(config_cls)}
        bad = sorted(set(config) - valid)
        if bad:
            raise ValueError(f"checkpoint config has fields {bad} that {config_cls.__name__} does not know")
        config = config_cls(**config)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        return builder(config)


def create_model(name: str, device: Optional[Union[str, torch.device]] = None, dtype: Optional[torch.dtype] = None,
                 **overrides: Any) -> nn.Module:
    """Build a registered preset; ``device="meta"`` allocates nothing. The module keeps ``.config`` (its dataclass),
    ``.family`` and ``.preset``."""
    config = model_config(name, **overrides)
    entry = _REGISTRY[name]
    model = build_from_config(entry.family, config, device)
    if dtype is not None:
        model = model.to(dtype)
    model.preset = name
    return model


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of distinct parameters (tied weights counted once); works on the meta device."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def preset_of(family: str, name: str) -> str:
    """``name`` if it is a preset of ``family``; otherwise a one-line ValueError saying what it is and which presets
    the family takes (``polymixer train image --preset tiny-pom`` must not end in a traceback)."""
    fam = family_entry(family)
    if name in _REGISTRY and _REGISTRY[name].family == fam.name:
        return name
    names = list_models(family=fam.name)
    tiny = [n for n in names if n.startswith("tiny-")]
    rest = [n for n in names if not n.startswith("tiny-")]
    takes = ", ".join(tiny + rest) if len(names) <= 12 else (
        f"{', '.join(tiny)} and {len(rest)} paper-size presets ({', '.join(rest[:3])}, …; "
        f"list_models(family={fam.name!r}))")
    verb = f"`polymixer train {fam.name}`" if fam.tiny else f"the {fam.name} family"
    if name in _REGISTRY:
        other = family_entry(_REGISTRY[name].family)
        raise ValueError(f"{name} is {other.title} (family {other.name}); {verb} takes: {takes}")
    close = difflib.get_close_matches(name, list_models(family=fam.name), n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"unknown preset {name!r}; {hint}{verb} takes: {takes}")
