"""The one training loop every family runs (checkpoints are the library's: :mod:`polymixer.checkpoint`)."""

from .loop import TrainConfig, train

__all__ = ["TrainConfig", "train"]
