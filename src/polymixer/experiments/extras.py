"""Which optional extra of polymixer provides a package the commands import where used: a command whose extra is
missing stops with one line that names it (``pip install "polymixer[lab]"``), not a traceback. A missing module
that no extra provides is a bug, and still raises."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

__all__ = ["EXTRAS", "missing_extra"]

# top-level import name → (the package pip installs, the extra of pyproject.toml that holds it)
EXTRAS: Dict[str, Tuple[str, str]] = {
    "matplotlib": ("matplotlib", "lab"),
    "sklearn": ("scikit-learn", "lab"),
    "PIL": ("pillow", "lab"),
    "scipy": ("scipy", "lab"),
    "rapidfuzz": ("rapidfuzz", "lab"),
    "plyfile": ("plyfile", "lab"),
    "tqdm": ("tqdm", "lab"),
    "filelock": ("filelock", "lab"),
    "transformers": ("transformers", "hf"),
    "regex": ("regex", "bpe"),
    "triton": ("triton", "gpu"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
}


def missing_extra(error: BaseException) -> Optional[str]:
    """The one line to print when ``error`` (an ImportError, or one raised from it) comes from a package of an extra
    that is not installed; None when the missing module belongs to no extra."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        name = (getattr(error, "name", None) or "").split(".")[0]
        if isinstance(error, ModuleNotFoundError) and name in EXTRAS:
            package, extra = EXTRAS[name]
            return (f'this command needs the [{extra}] extra ({package} is not installed): '
                    f'pip install "polymixer[{extra}]"')
        error = error.__cause__ or error.__context__
    return None
