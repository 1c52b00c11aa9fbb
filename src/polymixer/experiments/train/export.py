"""``polymixer export checkpoint RUN --out DIR``: a checkpoint as one ``model.safetensors`` (with its config.json and
manifest), the folder that :func:`polymixer.checkpoint.load_model`, the evaluation commands and the transformers
integration read.

Made for the sharded checkpoints of ``--fsdp`` runs (one shard file per rank): one process, no process group, reads
every rank's shards into the model the checkpoint's config describes and writes its whole weights once. A checkpoint
of whole weights is copied the same way (its weights, not its training state).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ...checkpoint import is_sharded, load_model, read_config, resolve_checkpoint, save_weights_folder

__all__ = ["add_arguments", "main", "export_checkpoint"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The export command's options: the run or checkpoint folder, and the folder to write."""
    p.add_argument("ckpt", metavar="RUN", help="a run folder (its newest intact checkpoint) or one checkpoint folder")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the checkpoint folder to write (must not exist, or be empty)")


def export_checkpoint(ckpt: str, out: str) -> Path:
    """Write the weights of ``ckpt`` (sharded or not) as a single-file checkpoint folder at ``out``; returns it."""
    ck = resolve_checkpoint(ckpt)
    model = load_model(ck)
    return save_weights_folder(out, model, {**read_config(ck), "exported_from": str(ck)})


def main(args: argparse.Namespace) -> int:
    ck = resolve_checkpoint(args.ckpt)
    dest = export_checkpoint(args.ckpt, args.out)
    kind = "sharded" if is_sharded(ck) else "single-file"
    size = (dest / "model.safetensors").stat().st_size
    print(f"exported the {kind} checkpoint {ck} to {dest} (model.safetensors, {size / 2**20:,.1f} MiB)")
    return 0
