"""How the command line reaches a family's commands: the module of each ``polymixer <verb> <family>``, its data
loaders and offline default, and how a command runs (one line and status 2 on bad input, the process group it joined
destroyed at the end). The family table itself is the library's (:mod:`polymixer.families`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Dict, Optional, Sequence, Tuple

from ..families import Family, family
from .extras import missing_extra

__all__ = ["COMMAND_HELP", "loader_module", "default_module", "load_command", "task_target", "run_command",
           "process_group_joined", "run_family_command", "COMMAND_ERRORS"]


# family → verb → (short help, long description) for the verbs the family takes as a noun (train, eval, bench)
COMMAND_HELP: Dict[str, Dict[str, Tuple[str, str]]] = {
    "lm": {
        "train": ("train a language model (GPT-2 / GPPoM2 / hybrid)",
                  "Train a language model preset on text files (default: the Python standard library's sources)."),
        "eval": ("validation loss, bits per byte and length generalisation",
                 "Evaluate a language-model checkpoint at its training context and at multiples of it."),
        "bench": ("language models: throughput, decoding cost vs context, quality at equal budget",
                  "Forward throughput, per-token decoding time and memory, and trained quality of attention / PoM / "
                  "hybrid language models."),
    },
    "image": {
        "train": ("train a class-conditional diffusion transformer (SiT / SiPoM / DiT / DiPoM)",
                  "Train an image generator with flow matching or DDPM (default data: scikit-learn's digits)."),
        "eval": ("conditional accuracy and Fréchet distance of generated images",
                 "Score generated images with a small classifier trained once on the real data."),
        "bench": ("diffusion transformers: seconds per image vs image side, quality at equal budget",
                  "Forward time of SiT vs SiPoM across image sizes, and SiT vs SiPoM trained with equal steps."),
    },
    "ocr": {
        "train": ("train a handwriting recogniser (HTR-VT / HTR-VPoM / hybrid)",
                  "Train a CTC text-line recogniser on lines or multi-line pages (default data: synthetic lines "
                  "rendered offline; --data DIR for IAM / READ2016 / LAM in HTR-VT's layout or IAM's own)."),
        "eval": ("character and word error rates, lines/s, sample lines",
                 "Evaluate a recogniser on a split: CER and WER over the set, throughput, and a PNG of sample lines "
                 "with reference and prediction."),
        "bench": ("handwriting recognition: lines/s vs page length, quality at equal budget",
                  "Throughput of HTR-VT / HTR-VPoM / hybrid at paper size on lines and pages of 2 to 16 lines, and "
                  "CER / WER of the tiny presets trained with equal steps."),
    },
    "eo": {
        "train": ("train a crop-type segmenter of satellite time series (TSViT / TSViPoM / hybrid)",
                  "Train a Sentinel-2 time-series segmenter on PASTIS-layout data (default: a synthetic PASTIS "
                  "written offline; --data DIR for PASTIS itself), on 24×24 windows or whole patches."),
        "eval": ("overall accuracy, per-class IoU, mIoU and km²/s of a crop-type segmenter",
                 "Evaluate a segmenter on a PASTIS fold's split over every non-void pixel: OA, per-class IoU, mIoU, "
                 "throughput in km²/s, a confusion-matrix PNG and a PNG of tiles (RGB, truth, prediction)."),
        "bench": ("satellite time series: km²/s vs window side, quality at equal budget, whole patches",
                  "Throughput of TSViT / TSViPoM / hybrid at paper size on windows of 24 to 128 pixels, and OA / "
                  "mIoU of the tiny presets trained with equal steps, evaluated on windows and whole patches."),
    },
    "points": {
        "train": ("train a point-cloud segmenter (PTv3 / PPoMv3 / hybrid)",
                  "Train a 3-D semantic segmenter on ScanNet-layout scenes, SemanticKITTI or .ply files (default: "
                  "synthetic indoor rooms generated offline in ScanNet's layout)."),
        "eval": ("mIoU, per-class IoU, overall accuracy and 10⁶ points/s of a point-cloud segmenter",
                 "Evaluate a 3-D segmenter on a split as PTv3 does (intersection and union over every original "
                 "point, predictions mapped back through the voxels), throughput, and top-view PNGs of scenes."),
        "bench": ("point clouds: 10⁶ points/s vs scene size and patch size, sparse conv, quality at equal budget",
                  "Throughput of PTv3 / PPoMv3 / hybrid at paper size on scenes of 10k to 160k voxels with patches "
                  "of 1,024 to the whole scene, the sparse convolution's backward, and mIoU of the tiny presets "
                  "trained with equal steps."),
    },
    "recall": {
        "bench": ("MQAR recall: accuracy vs state size for PoM, value-carrying PoM, attention, Based, …",
                  "Zoology's multi-query associative recall: 2-layer models of many mixers trained on MQAR, accuracy "
                  "against state floats per layer (L = 64, K = 16) and against sequence length, several seeds."),
    },
}


def loader_module(fam: Family) -> str:
    """The module of the family's loaders, with ``check_data(root, progress=…)``: every bad file and its reason in
    one pass."""
    return f"polymixer.experiments.{fam.name}.data"


def default_module(fam: Family) -> str:
    """The module with ``resolve_data(data, progress=…)``: None or the default's name → the offline default
    (generated once into the cache); a folder → checked to exist."""
    return f"polymixer.experiments.{fam.name}.synth" if fam.synthetic else loader_module(fam)


def task_target(fam: str, verb: str) -> str:
    """The command-module target of ``polymixer <verb> <family>`` (see :func:`load_command`)."""
    if verb == "bench":
        return f"polymixer.experiments.{family(fam).name}.bench"
    return f"polymixer.experiments.{family(fam).name}.task:{verb.replace('-', '_')}"


def load_command(target: str) -> Tuple[Callable, Callable]:
    """A command's (add_arguments, main) from its target: ``module`` (functions ``add_arguments`` / ``main``) or
    ``module:name`` (``add_<name>_arguments`` / ``main_<name>``). Imported on demand so the CLI starts fast."""
    module, _, name = target.partition(":")
    mod = importlib.import_module(module)
    if name:
        return getattr(mod, f"add_{name}_arguments"), getattr(mod, f"main_{name}")
    return mod.add_arguments, mod.main


# what a command's failure on bad input raises: printed as one line and exit status 2, never a traceback
COMMAND_ERRORS = (ValueError, TypeError, FileNotFoundError, FloatingPointError)


def process_group_joined() -> bool:
    """Whether this process has joined a torch.distributed default group (False where torch is not even imported)."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def run_command(run: Callable[[argparse.Namespace], Optional[int]], args: argparse.Namespace, name: str) -> int:
    """Run a parsed command: its status, or 2 with one line ``polymixer <name>: error: …`` on bad input or
    when a package of an extra it needs is missing (the line names the extra).

    A process group the command joined (a run under torchrun) is destroyed when it ends, whatever the outcome, so no
    communicator thread is left to the interpreter's exit (gloo's can abort a finished rank there); a group the
    caller had joined before is left alone."""
    owned = not process_group_joined()
    try:
        return int(run(args) or 0)
    except COMMAND_ERRORS as e:
        print(f"polymixer {name}: error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:  # a package of an extra that is not installed: which extra, in one line
        if (line := missing_extra(e)) is None:
            raise
        print(f"polymixer {name}: error: {line}", file=sys.stderr)
        return 2
    finally:
        if owned and process_group_joined():
            sys.modules["torch.distributed"].destroy_process_group()


def run_family_command(verb: str, noun: str, argv: Sequence[str]) -> int:
    """``polymixer <verb> <noun> argv…`` through the families table alone (no full command-line parser): what a
    wrapper process runs, e.g. ``bench faults``' probe around ``polymixer train <family>``."""
    fam = family(noun)
    add, run = load_command(task_target(fam.name, verb))
    parser = argparse.ArgumentParser(prog=f"polymixer {verb} {fam.name}")
    add(parser)
    args = parser.parse_args(list(argv))
    args.verb, args.noun = verb, fam.name
    return run_command(run, args, f"{verb} {fam.name}")
