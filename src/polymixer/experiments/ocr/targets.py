"""The ocr family's comparison with attention: the models ``polymixer bench parity`` compares, the options
offered to each alike, and the targets a verdict is judged against (:class:`~polymixer.experiments.bench.comparison.
Comparison`)."""

from __future__ import annotations

from ..bench.comparison import Comparison

__all__ = ["COMPARISON"]

COMPARISON = Comparison(
    "handwriting (synthetic lines)", "ocr", "CER %", "cer", False, "relative", "tiny-htr-vt", "tiny-htr-vpom-paper",
    "tiny-htr-vpom-value", full_hybrids=("tiny-htr-vpom-hybrid-paper",), where={"task": "synthetic"},
    key="preset", scale=100, best_target=0.05, guide="docs/ocr.md", options=("+attention_shift=2",),
    shift_options=("+attention_shift=2",), select="val_cer",
    # the paper's own models at the paper's tolerance, in the paper's form (a gate per channel) with polymixer's
    # (a gate scalar per head) beside it: does its claim reproduce here
    paper_targets=(("tiny-htr-vpom-paper", 0.15), ("tiny-htr-vpom-hybrid-paper", 0.05)),
    forms={"tiny-htr-vpom-paper": ("tiny-htr-vpom",), "tiny-htr-vpom-hybrid-paper": ("tiny-htr-vpom-hybrid",)},
    # the compared forms timed as themselves at HTR-VT's size on pages of 16 lines (fp32), beside the presets
    speed_file="ocr_forms/ocr.json",
    command="polymixer bench ocr --parts quality --tasks synthetic --quality-presets {spec} --sweep {spec} "
            "--lr-factors 0.5 1 2 4 --out docs/bench",
    paper=(("HTR-VT on LAM, CER %",), {"tiny-htr-vt": (2.8,), "tiny-htr-vpom-paper": (3.2,),
                                       "tiny-htr-vpom-hybrid-paper": (2.8,)}),
    digits=2, trained_on="synthetic text lines (IAM-like stand-in)",
)
