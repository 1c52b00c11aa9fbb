"""One registry for every model family (timm-style): ``create_model(name, **overrides)``, ``list_models()``
(:mod:`polymixer.models.registry`), and one model file per built-in family (:data:`polymixer.families.BUILT_IN`),
each registering its presets on import."""

import importlib

from ..families import BUILT_IN
from .registry import (
    ModelEntry,
    build_from_config,
    check_overrides,
    count_parameters,
    create_model,
    list_models,
    model_config,
    preset_of,
    register_model,
)

__all__ = ["register_model", "create_model", "list_models", "model_config", "build_from_config", "count_parameters",
           "ModelEntry", "preset_of", "check_overrides"]

for _name in BUILT_IN:  # each family's presets register on import
    importlib.import_module(f"{__name__}.{_name}")
