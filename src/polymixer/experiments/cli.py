"""``polymixer <verb> <noun>``: one command-line grammar for every model family.

    polymixer train lm --preset tiny-pom        train a language model (the shared loop; torchrun for DDP)
    polymixer generate --ckpt RUN --prompt ...  sample from a language model
    polymixer eval lm --ckpt RUN                val loss, bits per byte, length generalisation
    polymixer bench mixer [--quick]             PoM vs attention across sequence lengths (table, JSON, PNG)
    polymixer bench lm [--quick]                language models: throughput, decoding, quality
    polymixer bench models --device cuda        the paper's models on a GPU (or --dry-run on the CPU)
    polymixer bench gpu --report OUT            docs/gpu.md's measured section from a scripts/gpu-check folder
    polymixer export hf --ckpt RUN --out DIR    a language model as a transformers folder (and import hf back)
    polymixer export checkpoint RUN --out DIR   a sharded (--fsdp) checkpoint as one model.safetensors folder
    polymixer distill lm --teacher RUN --pattern LPLP   convert attention → hybrid / PoM and distil it
    polymixer bench distill [--quick]           distilled vs from-scratch students at an equal token budget
    polymixer train image --preset tiny-sipom   train a diffusion transformer (default data: digits)
    polymixer sample --ckpt RUN --cfg 4         a class-conditional sample grid
    polymixer eval image --ckpt RUN             conditional accuracy and Fréchet distance
    polymixer bench image [--quick]             seconds per image vs side, quality at equal budget
    polymixer train ocr --preset tiny-htr-vpom  train a handwriting recogniser (default data: synthetic lines)
    polymixer eval ocr --ckpt RUN               CER, WER, lines/s and a PNG of sample lines
    polymixer read --ckpt RUN IMAGE...          transcribe line images
    polymixer bench ocr [--quick]               lines/s vs page length, quality at equal budget
    polymixer train eo --preset tiny-tsvipom    train a crop-type segmenter (default data: synthetic PASTIS)
    polymixer eval eo --ckpt RUN                OA, mIoU, per-class IoU, km²/s, confusion and tiles PNGs
    polymixer segment --ckpt RUN --data D --patch ID   the class map of a whole patch (.npy and .png)
    polymixer bench eo [--quick]                km²/s vs window side, quality at equal budget, whole patches
    polymixer train points --preset tiny-ppomv3 train a point-cloud segmenter (default data: synthetic rooms)
    polymixer eval points --ckpt RUN            mIoU, per-class IoU, OA, 10⁶ points/s, scene PNGs
    polymixer segment3d --ckpt RUN SCENE...     per-point labels of scenes (.npy, coloured .ply, PNG)
    polymixer bench points [--quick]            10⁶ points/s vs scene size and patch, quality at equal budget
    polymixer bench faults [--quick]            SIGKILL / SIGTERM / truncated checkpoint / NaN in every family
    polymixer bench recall [--quick]            MQAR recall accuracy vs state size across mixers
    polymixer check-data <family> --data DIR    every bad file of a dataset with its reason, in one pass
    polymixer plot RUN [RUN ...]                training curves (loss, learning rate, evaluations) as a PNG

The families and their commands come from the families' registry (:mod:`polymixer.experiments.registry`: the
built-in families and those of other packages); a family's earlier name (``3d`` for points) still works as a noun.
``polymixer --version`` prints the version; ``polymixer --help`` ends with examples, where outputs go and the guides;
``train <family> --preset P --help`` shows P's values.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import warnings
from typing import Dict, List, Optional

from ..families import FAMILIES
from .commands import load_command, run_command
from .registry import Command, families
from .tasks.common import HELP_PRESET

# verb → noun → (help, target, description): each family's commands come from its registration (the families'
# registry); the shared ones are below. Each entry imports its module lazily so the CLI starts fast
SHARED_BENCHES: Dict[str, Command] = {  # `polymixer bench <noun>`: the benches every family shares
    "mixer": Command("PoM vs attention across sequence lengths at a fixed token budget",
                     "polymixer.experiments.bench.mixer",
                     "Time forward and forward+backward of PoM and the value PoM (two sizes), full and causal, eager "
                     "and compiled, against SDPA and naive attention; on a GPU the Triton routes beside them."),
    "models": Command("the paper's models on a GPU: GPT-2-S vs GPPoM2-S / hybrid / value PoM, SiT-XL/2 vs SiPoM-XL/2",
                      "polymixer.experiments.bench.models",
                      "Compiled, bf16, FlashAttention: forward tokens/s at the paper's token budget beside its table, "
                      "training step time and memory, decoding time per token at 1k-64k context, images/s at 256 and "
                      "512 px; out-of-memory configurations listed. --dry-run: the same on the CPU at tiny sizes."),
    "gpu": Command("the GPU check: every kernel alone against a copy's bandwidth, the check's summary, docs/gpu.md",
                   "polymixer.experiments.bench.gpu",
                   "--kernels: time every Triton kernel alone (TB/s, and ÷ a large clone's); --summary: the summary of "
                   "a scripts/gpu-check folder; --report: regenerate docs/gpu.md's measured section from one and copy "
                   "its JSON to docs/bench/gpu_<card>/."),
    "roofline": Command("a roofline MODEL of GPT-2 vs GPPoM2-S on a GPU: predicted tokens/s, not measured",
                        "polymixer.experiments.bench.roofline",
                        "Count each kernel's FLOPs and HBM bytes of one forward pass and predict its time on an H100 / "
                        "H200 / A100 (GEMMs, FlashAttention-2, PoM's Triton mixing); beside the paper's "
                        "measurements."),
    "parallel": Command("context parallelism: bytes sent, step time and memory per rank against N and ranks",
                        "polymixer.experiments.bench.parallel",
                        "Run a causal PoM, value-PoM and attention layer (forward + backward) split over P gloo "
                        "processes: bytes each rank sends (counted from the collectives), step time and peak memory "
                        "per rank, the longest N a memory budget holds, and a labelled model of 8 × H100 over "
                        "NVLink."),
    "parity": Command("every family's linear-time models against attention at equal budget, from the benches' results",
                      "polymixer.experiments.bench.parity",
                      "Read the quality part of each family's bench (its JSON in --out), take each model at its best "
                      "learning rate and write one table: attention against PoM, the value PoM and the best hybrid, "
                      "the gaps, rates and seeds, and the parity targets judged."),
    "faults": Command("fault injection into training: SIGKILL, SIGTERM, truncated checkpoint, NaN loss; every family",
                      "polymixer.experiments.bench.faults",
                      "Train a tiny preset of each family once uninterrupted and again under faults (SIGKILL at random "
                      "moments, some inside a checkpoint write; SIGTERM; a truncated newest checkpoint; a NaN loss), "
                      "resuming each time; report faults survived, steps lost and whether the final weights are "
                      "bit-identical."),
}
SHARED_VERBS: Dict[str, Dict[str, Command]] = {  # the other shared commands: verb → noun ("": none) → command
    "export": {"checkpoint": Command("a sharded (--fsdp) checkpoint as one model.safetensors folder",
                                     "polymixer.experiments.train.export",
                                     "Read every rank's shards of a run's newest intact checkpoint (or of the "
                                     "checkpoint folder named) on one process and write model.safetensors, "
                                     "config.json and a manifest into --out: the folder load_model, the eval "
                                     "commands and export hf read. Optimizer state is not exported.")},
    "kernels": {"": Command("build the Triton kernels ahead of time for NVIDIA GPUs (no GPU needed)",
                            "polymixer.experiments.bench.aot",
                            "Compile every Triton kernel at every launch configuration for the given architectures and "
                            "report registers, spills and shared memory per build (status 1 if any fails or "
                            "spills).")},
    "plot": {"": Command("training curves of one or more runs as a PNG", "polymixer.experiments.report:plot",
                         "Overlay the loss, learning rate and evaluation metrics of runs (their history.json) in one "
                         "PNG.")},
}


def _check_data(name: str) -> Optional[Command]:
    """``polymixer check-data <family>`` where the family has dataset files to check."""
    fam = families()[name]
    if fam.loaders is None:
        return None
    default = f" (default: the offline default, '{fam.default_data}')" if fam.default_data else ""
    return Command(f"check every file of {fam.family.title.split(' ', 1)[1]} dataset and list the bad ones",
                   "polymixer.experiments.tasks.check",
                   f"Read the headers and lengths of every file of a {name} dataset{default} and list each bad file "
                   f"with its reason, in one pass; status 1 if any.")


def _commands() -> Dict[str, Dict[str, Command]]:
    out: Dict[str, Dict[str, Command]] = {"train": {}, "eval": {}, "check-data": {}, "bench": {}}
    plain: Dict[str, Dict[str, Command]] = {}  # verbs without a noun, after those with one
    for name, fam in families().items():
        for (verb, noun), command in fam.commands.items():
            (plain if noun == "" else out).setdefault(verb, {})[noun] = command
        check = _check_data(name)
        if check is not None:
            out["check-data"][name] = check
    out["bench"].update(SHARED_BENCHES)
    for verb, nouns in SHARED_VERBS.items():
        (plain if "" in nouns else out).setdefault(verb, {}).update(nouns)
    return {**out, **plain}


COMMANDS: Dict[str, Dict[str, Command]] = _commands()
# benches that time nothing (a busy machine changes none of their figures): no warning about the load
UNTIMED_BENCHES = ("roofline", "faults", "parity", "gpu") + tuple(n for f in families().values() for n in f.untimed)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in every option's help (not "(default: None)" or "(default: False)"), metavars named after the
    option (``--n-layer N_LAYER``, not ``M_MIXER``), and descriptions and epilogs wrapped line by line (an example
    command stays on its own line)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            lead = indent + line[:len(line) - len(line.lstrip())]
            lines.append(textwrap.fill(line.strip(), width, initial_indent=lead, subsequent_indent=lead + "  "))
        return "\n".join(lines)

    def _get_help_string(self, action: argparse.Action) -> str:
        help_ = action.help or ""
        if "%(default)" in help_ or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return help_
        return f"{help_} (default: %(default)s)" if help_ else "default: %(default)s"


# `polymixer --help`'s epilog: what a first session types, where everything it writes goes, and where to read on
EPILOG = """examples:
  polymixer bench mixer --quick                     PoM vs attention on this machine (~1.5 min)
  polymixer train lm --preset tiny-pom --steps 200  a tiny language model (any family: train <family> --help)
  polymixer eval lm --ckpt runs/lm/tiny-pom         its validation loss and bits per byte
  polymixer generate --ckpt runs/lm/tiny-pom --prompt "def "
  polymixer plot runs/lm/tiny-pom                   its training curves as a PNG

where outputs go (--out moves each):
  runs/<family>/<preset>/  a training run: checkpoints/, history.json, curves.png (the same command resumes it)
  runs/bench/<bench>/      a bench's JSON, text report and PNG (docs/bench/ holds those the docs quote)
  ~/.cache/polymixer/      the offline default datasets, generated once (POLYMIXER_CACHE=DIR moves it)

docs (in the repository):
  README.md                start here
  docs/<family>.md         lm, image, ocr, eo, points, recall: what you can do, how, what it costs
  docs/mixer.md            the speed bench; docs/parallel.md scale-out; docs/faults.md preemption and resume"""


def _family_epilog(verb: str, fam: str) -> str:
    """The epilog of ``polymixer <verb> <family>``: for train an example run and where it goes; the family's
    guide."""
    guide = f"guide: docs/{fam}.md"
    tiny = FAMILIES[fam].tiny
    if verb != "train" or tiny is None:
        return guide
    return (f"example:\n  polymixer train {fam} --preset {tiny} --steps 200 --out runs/{fam}/try\n"
            f"  polymixer plot runs/{fam}/try; polymixer eval {fam} --ckpt runs/{fam}/try\n"
            f"the run folder holds checkpoints/, history.json and curves.png; the same command again resumes it (or "
            f"says it is complete); --no-resume starts over.\n{guide}")


def version() -> str:
    """The installed distribution's version (``polymixer.__version__`` where polymixer runs uninstalled, from its
    source folder): pyproject.toml reads its version from ``polymixer.__version__``, the one place it is written."""
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("polymixer")
    except PackageNotFoundError:  # (the package's __init__ ran before this module: reading it adds no import)
        return sys.modules["polymixer"].__version__


def build_parser(help_preset: Optional[str] = None) -> argparse.ArgumentParser:
    """The whole command line. ``help_preset``: the ``--preset`` a ``--help`` request named, whose values the train
    commands' help then shows (see :func:`~polymixer.experiments.tasks.common.shown_preset`)."""
    parser = argparse.ArgumentParser(prog="polymixer", description="The Polynomial Mixer: models, training, "
                                     "generation, evaluation and benchmarks.", epilog=EPILOG,
                                     formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"polymixer {version()}")
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)
    for verb, nouns in COMMANDS.items():
        if "" in nouns:  # a verb without a noun, e.g. `polymixer generate`
            short, module, desc = nouns[""]
            vp = verbs.add_parser(verb, help=short, description=desc, formatter_class=_HelpFormatter)
            load_command(module)[0](vp)
            vp.set_defaults(_module=module, noun="")
            continue
        vp = verbs.add_parser(verb, help=f"{verb} ({', '.join(nouns)})")
        sub = vp.add_subparsers(dest="noun", metavar="<what>", required=True)
        for noun, (short, module, desc) in nouns.items():
            fam = noun in FAMILIES
            np_ = sub.add_parser(noun, aliases=list(FAMILIES[noun].aliases) if fam else [],  # earlier names work
                                 help=short, description=desc, epilog=_family_epilog(verb, noun) if fam else None,
                                 formatter_class=_HelpFormatter)
            if help_preset:
                np_.set_defaults(**{HELP_PRESET: help_preset})
            load_command(module)[0](np_)
            np_.set_defaults(_module=module, noun=noun)
    return parser


def _help_preset(argv: List[str]) -> Optional[str]:
    """The ``--preset`` of a command line that asks for help (None otherwise)."""
    if not {"-h", "--help"} & set(argv):
        return None
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--preset")
    return pre.parse_known_args(argv)[0].preset


def _format_warning(message: Warning | str, category: type, filename: str, lineno: int,
                    line: Optional[str] = None) -> str:
    """polymixer's own warnings (their categories live in polymixer's modules) as one line, without the source line
    that raised them; every other warning as Python formats it."""
    if category.__module__.startswith("polymixer."):
        return f"polymixer: warning: {message}\n"
    return _PLAIN_FORMAT(message, category, filename, lineno, line)


_PLAIN_FORMAT = warnings.formatwarning


def install_warning_format() -> None:
    """polymixer's own warnings print as one line (``polymixer: warning: …``), as the command line shows them."""
    warnings.formatwarning = _format_warning


def main(argv: Optional[List[str]] = None) -> int:
    install_warning_format()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_help_preset(argv)).parse_args(argv)
    _, run = load_command(args._module)
    name = f"{args.verb}{' ' + args.noun if args.noun else ''}"
    if args.verb != "bench" or args.noun in UNTIMED_BENCHES or getattr(args, "report", False):  # (--report: no timing)
        return run_command(run, args, name)
    from .bench.common import MachineLoad

    with MachineLoad() as load:
        status = run_command(run, args, name)
    if load.warning():
        print(f"polymixer {name}: warning: {load.warning()}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
