"""What ``polymixer bench parity`` compares in one family: where its quality rows are, how to read them, which models
stand for attention, PoM, the value PoM and the hybrids, the options offered to every model alike, the targets, the
paper's figures and how the table shows them. Each family's own comparisons live in its folder and reach ``bench
parity`` through its registration (:attr:`~polymixer.experiments.registry.LabFamily.comparisons`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .common import seed_payloads

__all__ = ["Comparison"]

_LR_FACTORS = re.compile(r"--lr-factors((?: [0-9.]+)+)")  # a family command's grid of rate factors
_OUT = re.compile(r"--out (\S+)")  # a family command's output folder
_LARGER = re.compile(r" --larger \S+")  # a family command's overrides that make its models larger


@dataclass(frozen=True)
class Comparison:
    """Where a family's quality rows are and how to read them."""

    name: str
    bench: str  # <out>/<bench>.json (unless ``file`` says otherwise), the family's bench
    label: str  # the metric as the table names it
    metric: str  # the row's key
    higher: bool  # higher is better
    gap: str  # "relative" (+% worse), "ratio" (× attention's) or "points" (percentage points, − worse)
    attention: str
    pom: Optional[str]
    value: Optional[str]
    hybrids: Tuple[str, ...] = ()  # hybrids with no full-attention layer (local attention or none)
    full_hybrids: Tuple[str, ...] = ()  # hybrids that keep full-attention layers: shown, not linear-time
    where: Dict[str, Any] = field(default_factory=dict)  # rows of this bench that belong to the comparison
    key: str = "spec"  # the row's model name
    scale: float = 1.0  # metric × scale as shown
    best_target: Optional[float] = None  # best model without full attention: gap at most (or, points: at least)
    all_target: Optional[float] = None  # the all-PoM / all-value-PoM model: gap at most (points: at least)
    part: str = "quality"
    guide: str = ""
    # variants offered to every model alike, as suffixes of its preset ("+position=sincos_rope"): each model is
    # compared in whichever of its plain preset and these variants scores best on validation (the median over the
    # seeds each ran), so an option that helps attention as much as PoM raises the baseline instead of crediting the
    # mixer
    options: Tuple[str, ...] = ()
    # options that give attention layers the token shift: they apply to attention and the hybrids only (a model with
    # no attention layer would be the same model)
    shift_options: Tuple[str, ...] = ()
    # the validation figure options are picked on (the benches pick rates on it too); None: the family has none and
    # picks on the reported figure, which the table says
    select: Optional[str] = None
    # ``name`` and ``metric`` may name fields of the bench's configuration ("miou_{crop}"): a bench run with another
    # configuration is judged on its own figures; these are the fields' values where the JSON names none
    defaults: Dict[str, Any] = field(default_factory=dict)
    file: Optional[str] = None  # the JSON under <out> where it is not <bench>.json (another recipe's folder)
    # other seeds' runs in folders beside the JSON (<its folder>/<its name>_seed<N>/<its name>.json); False: the
    # rows summarise their own seeds (recall: ``by_seed``)
    seed_folders: bool = True
    # the command that trains a model form ({spec}) of this family's comparison, for the "to run" lines
    command: str = ""
    # config fields of a model's own preset (value heads, shift width, …): every run variant of a model over these
    # (and the options' fields) is one of its forms, chosen on validation like the options — so a preset steered
    # by test figures is replaced by the form validation picks
    tuned: Tuple[str, ...] = ()  # (shift_width: token_shift's earlier name, in the recorded runs' variants)
    # forms of the value PoM only, with their exact values (the gated value PoM, "+mixer=gated_value_pom": the value
    # PoM whose state forgets): offered like the options, so the value PoM is compared in its best form, and shown
    # "not run" where they were not
    value_options: Tuple[str, ...] = ()
    # each compared model's own forms beside its preset, offered like the options and chosen on validation: suffixes
    # of its preset ("+position=learned": attention in the paper's positions) or other specs ("tiny-pom": polymixer's
    # form beside the paper's PoM, ``tiny-pom-paper``); each one not run is shown "not run", with its command
    forms: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    # a target of the family's own beyond the shared ones (recall: the value PoM against Based on Zoology's figure
    # 2), judged from its bench JSON by this function: (the target, as the others are, and the commands that run what
    # it lacks)
    extra_target: Optional[Callable[["Comparison", Optional[Dict[str, Any]]], Tuple[Dict[str, Any], List[str]]]] = None
    # attention's own target where the family sets one: its plain preset (no option) at least this figure (as shown,
    # × ``scale``) at its best rate (recall: attention learns MQAR, ≥ 99%)
    attention_floor: Optional[float] = None
    # the paper's own models with the paper's tolerance for each: (preset, bound on the gap to attention, as
    # ``best_target``), each judged like the other targets in the form it is compared as — whether the paper's claim
    # for that model reproduces here
    paper_targets: Tuple[Tuple[str, float], ...] = ()
    # a score (on the selection figure, unscaled) no other rate can beat: a model there at an end of its sweep
    # needs no rate beyond it
    ceiling: Optional[float] = None

    # the speed bench's JSON under <out> where it is not <bench>.json (the prose LM is timed by lm.json's throughput)
    speed_file: Optional[str] = None
    # the length the speeds are read at (the family's own context) instead of the longest both were timed at
    speed_length: Optional[int] = None
    # compared forms the speed bench times under another name (options that leave the timed model's compute as it
    # is: the context a preset is built for, the local window the bench uses too)
    timed_as: Dict[str, str] = field(default_factory=dict)
    # a comparison of models made larger by these config overrides ("+n_embd=256": ``bench lm --larger``): its
    # commands train the smaller spec with ``--larger``, at the smaller model's rate (the larger one's ÷
    # ``larger_rate``, the width rule's factor from the smaller model's rate to the larger one's)
    larger: str = ""
    larger_rate: float = 1.0

    # the paper's figures at GPU scale beside the compared models: what each figure is, and the figures of its
    # models (attention, PoM, the paper's hybrid) by their tiny presets, one per model pair the paper reports
    paper: Tuple[Tuple[str, ...], Dict[str, Tuple[float, ...]]] = ((), {})
    digits: int = 1  # the decimals its figures are shown with
    trained_on: str = ""  # what its runs are trained and scored on (the README's family column)

    # the count-based baseline beside the comparison (the LM: an interpolated n-gram of 0 to 5 tokens of context,
    # ``bench lm --parts ngram``): the JSON files under <out> whose ``ngram`` part may hold its corpus's rows, the
    # first with rows of ``tokenizer`` (the models' own tokens) read; the command that runs it where none has them.
    # A compared model whose bits per byte do not beat the best of those orders is labelled undertrained
    ngram_files: Tuple[str, ...] = ()
    tokenizer: str = "bytes"
    ngram_command: str = ""

    @property
    def heldout(self) -> bool:
        """Whether the figure reported (``metric``) is held out from the one every choice is made on (``select``):
        a test figure beside a validation one. Where they are the same figure (the LM's validation loss) the figure
        reported is the figure selected on, and no verdict settles on it."""
        return self.select is not None and self.select != self.metric

    @property
    def json_name(self) -> str:
        """The family's bench JSON under ``<out>``: ``file``, else ``<bench>.json``."""
        return self.file or f"{self.bench}.json"

    def seed_command(self, spec: str, factor: float, seed: int) -> str:
        """``command`` for ``spec`` at ``factor`` × the recipe's rate only, on seed ``seed``, into the seed folder
        this module reads (``<the command's --out>/<its JSON's name>_seed<N>``)."""
        stem = Path(self.json_name).stem
        return _OUT.sub(lambda m: f"--seed {seed} --out {m.group(1)}/{stem}_seed{seed}",
                        self.rate_command(spec, factor), count=1)

    def seed_payloads(self, folder: Path) -> List[Dict[str, Any]]:
        """The other seeds' bench JSONs beside the family's JSON under ``folder`` (none where its rows keep their own
        seeds)."""
        if not self.seed_folders:
            return []
        where = folder / self.json_name
        return seed_payloads(where.parent, where.stem, self.part)

    def rate_command(self, spec: str, factor: float) -> str:
        """``command`` for ``spec`` at ``factor`` × the recipe's rate only (a rate past the end of its sweep; the
        bench brackets on from there while the model stays best at the end); the command itself where it names no
        grid (recall: run again, its sweep brackets). A larger model's is its smaller model's rate, which the bench
        carries over (``larger``)."""
        if self.smaller(spec):
            factor /= self.larger_rate
        return self._with_factors(spec, [f"{round(factor, 6):g}"])

    def sweep_command(self, spec: str, done: Optional[float] = None) -> str:
        """``command`` for ``spec``: its sweep over the family's grid, less the factor ``done`` (× the recipe's rate)
        it already ran at — a model run at one rate only trains the others, and a fresh machine without that run's
        checkpoint does not train it again."""
        grid = _LR_FACTORS.search(self.command)
        factors = grid.group(1).split() if grid else []
        rest = [f for f in factors if done is None or not math.isclose(float(f), done, rel_tol=1e-3)]
        return self._with_factors(spec, rest or factors)

    def own_sweep_command(self, spec: str, done: Optional[float] = None) -> str:
        """``spec``'s sweep over the family's grid at its own size (less the factor ``done``): for a larger model
        (``larger``), the command trains that model itself over the grid (no ``--larger``), where the family's
        command would only carry its smaller model's rate over."""
        if not self.smaller(spec):
            return self.sweep_command(spec, done)
        return _LARGER.sub("", replace(self, larger="").sweep_command(spec, done), count=1)

    def _with_factors(self, spec: str, factors: Sequence[str]) -> str:
        """``command`` for ``spec`` with its ``--lr-factors`` replaced by ``factors`` (unchanged where it names
        none); a larger model's names its smaller spec, which ``--larger`` makes larger after its sweep."""
        command = self.command.format(spec=self.smaller(spec) or spec)
        return _LR_FACTORS.sub(f"--lr-factors {' '.join(factors)}", command)

    def smaller(self, spec: str) -> Optional[str]:
        """The smaller spec a larger model of this comparison was made from (``larger`` removed), else None."""
        return spec[:-len(self.larger)] if self.larger and spec.endswith(self.larger) else None

    def resolved(self, data: Optional[Dict[str, Any]]) -> "Comparison":
        """This family with ``name`` and ``metric`` filled from the configuration of ``data`` (its bench JSON)."""
        if not self.defaults:
            return self
        config = dict(self.defaults)
        if data is not None:
            config.update(data.get("config") or {})
            config.update(data.get(self.part, {}).get("config") or {})
        return replace(self, name=self.name.format(**config), metric=self.metric.format(**config))
