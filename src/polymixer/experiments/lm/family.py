"""The lm family's registration (:class:`~polymixer.experiments.registry.LabFamily`): its commands (train, eval,
bench, generate, the transformers export and import, and the distillation task's commands, which convert language
models), its corpora, what ``bench parity`` compares, its fault-tolerance recipe and its guides' tables."""

from __future__ import annotations

import argparse
from typing import Any, Dict, Optional, Tuple

from ...families import family
from ..registry import Command, FaultRecipe, LabFamily
from .tables import TABLES
from .targets import COMPARISONS

__all__ = ["FAMILY"]


def _check(args: argparse.Namespace) -> Optional[Tuple[Any, Dict[str, Any]]]:
    """``check-data lm``: the text files and folders given, or the default corpus (None)."""
    return args.data or None, {}


FAMILY = LabFamily(
    family("lm"),
    commands={
        ("train", "lm"): Command(
            "train a language model (GPT-2 / GPPoM2 / hybrid)", "polymixer.experiments.lm.task:train",
            "Train a language model preset on text files (default: the Python standard library's sources)."),
        ("eval", "lm"): Command(
            "validation loss, bits per byte and length generalisation", "polymixer.experiments.lm.task:eval",
            "Evaluate a language-model checkpoint at its training context and at multiples of it."),
        ("bench", "lm"): Command(
            "language models: throughput, decoding cost vs context, quality at equal budget",
            "polymixer.experiments.lm.bench",
            "Forward throughput, per-token decoding time and memory, and trained quality of attention / PoM / "
            "hybrid language models."),
        ("generate", ""): Command(
            "sample text from a trained language model", "polymixer.experiments.lm.task:generate",
            "Prefill the prompt in parallel, then decode token by token with per-layer state."),
        ("export", "hf"): Command(
            "a language-model checkpoint as a transformers folder", "polymixer.experiments.lm.task:export",
            "Write model.safetensors, config.json and the tokenizer: AutoModelForCausalLM.from_pretrained(DIR) loads "
            "it once polymixer is imported (needs the [hf] extra)."),
        ("import", "hf"): Command(
            "a transformers folder of a polymixer language model as a polymixer run",
            "polymixer.experiments.lm.task:import",
            "The reverse of export hf: a checkpoint that generate, eval lm, train lm --init-from and distill lm "
            "take."),
        ("distill", "lm"): Command(
            "convert an attention LM to PoM / hybrid and distil it (attention transfer, then fine-tuning)",
            "polymixer.experiments.distill.task:lm",
            "Replace the attention of the layers a pattern marks (P = PoM, L = local attention) in a polymixer run "
            "or a transformers GPT-2 / Llama-family folder, train the new mixers to match each replaced layer "
            "(stage 1), then fine-tune the whole student on the language-modelling loss (stage 2)."),
        ("bench", "distill"): Command(
            "attention LM converted to hybrid / all-PoM and distilled vs trained from scratch",
            "polymixer.experiments.distill.bench",
            "Train the tiny attention teacher, distil it into the hybrid and all-PoM patterns within a quarter of "
            "its training tokens, and train the same students from scratch on that budget; val loss vs tokens."),
    },
    loaders="polymixer.experiments.lm.data",
    default_data="stdlib",
    check=_check,
    comparisons=COMPARISONS,
    tables=TABLES,
    faults=FaultRecipe(("--mixer", "hybrid", "--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--block-size",
                        "64", "--window", "16", "--dropout", "0.1", "--batch-size", "8", "--eval-windows", "8",
                        "--ema", "0.99")),
    untimed=("distill",),
)
