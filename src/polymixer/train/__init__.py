"""The shared training loop and checkpoints."""

from .checkpoint import load_model, resolve_checkpoint, save_checkpoint
from .loop import TrainConfig, train

__all__ = ["TrainConfig", "train", "save_checkpoint", "load_model", "resolve_checkpoint"]
