"""The eo family's comparison with attention: the models ``polymixer bench parity`` compares, the options
offered to each alike, and the targets a verdict is judged against (:class:`~polymixer.experiments.bench.comparison.
Comparison`)."""

from __future__ import annotations

from ..bench.comparison import Comparison

__all__ = ["COMPARISON"]

COMPARISON = Comparison(
    "satellite ({crop} px windows)", "eo", "test mIoU %", "miou_{crop}", True, "points", "tiny-tsvit",
    "tiny-tsvipom-paper", "tiny-tsvipom-value", hybrids=("tiny-tsvipom-local",),
    full_hybrids=("tiny-tsvipom-hybrid-paper",), scale=100, best_target=-1.0,
    all_target=-8.0, guide="docs/eo.md", defaults={"crop": 24},
    # rotary dates with the LM's frequencies, and with periods of 21 days to 500 days suited to days of a
    # year; the value PoM's 4-token shift given to attention, with rotary dates
    options=("+date_rope=true", "+date_rope=true+date_rope_speed=0.3+date_rope_base=30",
             "+date_rope=true+attention_shift=4"),
    shift_options=("+date_rope=true+attention_shift=4",), select="val_miou",
    tuned=("value_heads", "token_shift", "shift_width", "expand", "degree"),
    value_options=("+date_rope=true+mixer=gated_value_pom",),
    # the paper's own model at the paper's tolerance, in the paper's form (a gate per channel) with polymixer's (a
    # gate scalar per head) beside it: does its claim reproduce here
    paper_targets=(("tiny-tsvipom-paper", -2.0),),
    forms={"tiny-tsvipom-paper": ("tiny-tsvipom",), "tiny-tsvipom-hybrid-paper": ("tiny-tsvipom-hybrid",)},
    # the compared forms timed as themselves at TSViT's size on whole 128 × 128 patches (fp32), beside the presets
    speed_file="eo_forms/eo.json",
    command="polymixer bench eo --parts quality --quality-models {spec} --sweep {spec} --lr-factors 0.5 1 2 4 8 "
            "--out docs/bench",
    paper=(("TSViT on PASTIS, mIoU %",), {"tiny-tsvit": (64.6,), "tiny-tsvipom-paper": (64.6,)}),
    trained_on="synthetic PASTIS-like tiles",
)
