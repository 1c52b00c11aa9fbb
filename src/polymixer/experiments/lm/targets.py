"""The lm family's comparison with attention: the models ``polymixer bench parity`` compares, the options
offered to each alike, and the targets a verdict is judged against (:class:`~polymixer.experiments.bench.comparison.
Comparison`)."""

from __future__ import annotations

from ..bench.comparison import Comparison

__all__ = ["COMPARISON"]

COMPARISON = Comparison(
    "language model", "lm", "val loss", "val_loss", False, "relative", "tiny-attention", "tiny-pom",
    "tiny-vpom", hybrids=("tiny-hybrid", "tiny-vhybrid"), best_target=0.02, all_target=0.10,
    guide="docs/lm.md", options=("+attention_shift=4",), shift_options=("+attention_shift=4",),
    select="val_loss", tuned=("value_heads", "token_shift", "shift_width"),
    value_options=("+mixer=gated_value_pom",),
    # the paper's own models at the paper's tolerance: does its claim reproduce here
    paper_targets=(("tiny-pom", 0.18), ("tiny-hybrid", 0.02)),
    command="polymixer bench lm --parts quality --presets {spec} --sweep {spec} --lr-factors 0.5 1 2 4 8 "
            "--out docs/bench",
)
