"""``polymixer <verb> <noun>``: one command-line grammar for every model family.

    polymixer train lm --preset tiny-pom        train a language model (the shared loop; torchrun for DDP)
    polymixer generate --ckpt RUN --prompt ...  sample from a language model
    polymixer eval lm --ckpt RUN                val loss, bits per byte, length generalisation
    polymixer bench mixer [--quick]             PoM vs attention across sequence lengths (table, JSON, PNG)
    polymixer bench lm [--quick]                language models: throughput, decoding, quality
    polymixer export hf --ckpt RUN --out DIR    a language model as a transformers folder (and import hf back)
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
    polymixer train 3d --preset tiny-ppomv3     train a point-cloud segmenter (default data: synthetic rooms)
    polymixer eval 3d --ckpt RUN                mIoU, per-class IoU, OA, 10⁶ points/s, scene PNGs
    polymixer segment3d --ckpt RUN SCENE...     per-point labels of scenes (.npy, coloured .ply, PNG)
    polymixer bench 3d [--quick]                10⁶ points/s vs scene size and patch, quality at equal budget
    polymixer bench faults [--quick]            SIGKILL / SIGTERM / truncated checkpoint / NaN in every family
    polymixer bench recall [--quick]            MQAR recall accuracy vs state size across mixers
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, List, Optional, Tuple

# verb → noun → (help, add_arguments, main); each entry imports its module lazily so the CLI starts fast
Command = Tuple[str, str, str]
COMMANDS: Dict[str, Dict[str, Command]] = {
    "train": {
        "lm": ("train a language model (GPT-2 / GPPoM2 / hybrid)", "polymixer.tasks.lm:train",
               "Train a language model preset on text files (default: the Python standard library's sources)."),
        "image": ("train a class-conditional diffusion transformer (SiT / SiPoM / DiT / DiPoM)",
                  "polymixer.tasks.image:train",
                  "Train an image generator with flow matching or DDPM (default data: scikit-learn's digits)."),
        "ocr": ("train a handwriting recogniser (HTR-VT / HTR-VPoM / hybrid)", "polymixer.tasks.ocr:train",
                "Train a CTC text-line recogniser on lines or multi-line pages (default data: synthetic lines "
                "rendered offline; --data DIR for IAM / READ2016 / LAM in HTR-VT's layout or IAM's own)."),
        "eo": ("train a crop-type segmenter of satellite time series (TSViT / TSViPoM / hybrid)",
               "polymixer.tasks.eo:train",
               "Train a Sentinel-2 time-series segmenter on PASTIS-layout data (default: a synthetic PASTIS written "
               "offline; --data DIR for PASTIS itself), on 24×24 windows or whole patches."),
        "3d": ("train a point-cloud segmenter (PTv3 / PPoMv3 / hybrid)", "polymixer.tasks.ptv3:train",
               "Train a 3-D semantic segmenter on ScanNet-layout scenes, SemanticKITTI or .ply files (default: "
               "synthetic indoor rooms generated offline in ScanNet's layout)."),
    },
    "sample": {
        "": ("sample an image grid from a trained generator", "polymixer.tasks.image:sample",
             "Class-conditional samples with classifier-free guidance, written as a PNG grid."),
    },
    "segment": {
        "": ("segment whole patches of a PASTIS-layout folder with a trained segmenter", "polymixer.tasks.eo:segment",
             "Write the class map of each patch as <ID>_classes.npy (uint8) and a PNG in the PASTIS colour map; the "
             "whole patch in one forward call by default."),
    },
    "segment3d": {
        "": ("segment point clouds with a trained 3-D segmenter", "polymixer.tasks.ptv3:segment3d",
             "Write each scene's per-point labels as <name>_labels.npy, a .ply coloured by class and a top-view PNG; "
             "the whole scene in one forward call."),
    },
    "read": {
        "": ("transcribe line images with a trained recogniser", "polymixer.tasks.ocr:read",
             "Print the greedy CTC transcription of each image (resized like the training lines)."),
    },
    "generate": {
        "": ("sample text from a trained language model", "polymixer.tasks.lm:generate",
             "Prefill the prompt in parallel, then decode token by token with per-layer state."),
    },
    "export": {
        "hf": ("a language-model checkpoint as a transformers folder", "polymixer.tasks.lm:export",
               "Write model.safetensors, config.json and the tokenizer: AutoModelForCausalLM.from_pretrained(DIR) "
               "loads it once polymixer is imported (needs the [hf] extra)."),
    },
    "import": {
        "hf": ("a transformers folder of a polymixer language model as a polymixer run", "polymixer.tasks.lm:import",
               "The reverse of export hf: a checkpoint that generate, eval lm, train lm --init-from and distill lm "
               "take."),
    },
    "distill": {
        "lm": ("convert an attention LM to PoM / hybrid and distil it (attention transfer, then fine-tuning)",
               "polymixer.tasks.distill:lm",
               "Replace the attention of the layers a pattern marks (P = PoM, L = local attention) in a polymixer "
               "run or a transformers GPT-2 / Llama-family folder, train the new mixers to match each replaced "
               "layer (stage 1), then fine-tune the whole student on the language-modelling loss (stage 2)."),
    },
    "eval": {
        "lm": ("validation loss, bits per byte and length generalisation", "polymixer.tasks.lm:eval",
               "Evaluate a language-model checkpoint at its training context and at multiples of it."),
        "image": ("conditional accuracy and Fréchet distance of generated images", "polymixer.tasks.image:eval",
                  "Score generated images with a small classifier trained once on the real data."),
        "ocr": ("character and word error rates, lines/s, sample lines", "polymixer.tasks.ocr:eval",
                "Evaluate a recogniser on a split: CER and WER over the set, throughput, and a PNG of sample lines "
                "with reference and prediction."),
        "eo": ("overall accuracy, per-class IoU, mIoU and km²/s of a crop-type segmenter", "polymixer.tasks.eo:eval",
               "Evaluate a segmenter on a PASTIS fold's split over every non-void pixel: OA, per-class IoU, mIoU, "
               "throughput in km²/s, a confusion-matrix PNG and a PNG of tiles (RGB, truth, prediction)."),
        "3d": ("mIoU, per-class IoU, overall accuracy and 10⁶ points/s of a point-cloud segmenter",
               "polymixer.tasks.ptv3:eval",
               "Evaluate a 3-D segmenter on a split as PTv3 does (intersection and union over every original point, "
               "predictions mapped back through the voxels), throughput, and top-view PNGs of scenes."),
    },
    "bench": {
        "mixer": ("PoM vs attention across sequence lengths at a fixed token budget", "polymixer.bench.mixer",
                  "Time forward and forward+backward of PoM (eager and compiled) against SDPA and naive attention."),
        "lm": ("language models: throughput, decoding cost vs context, quality at equal budget", "polymixer.bench.lm",
               "Forward throughput, per-token decoding time and memory, and trained quality of attention / PoM / "
               "hybrid language models."),
        "distill": ("attention LM converted to hybrid / all-PoM and distilled vs trained from scratch",
                    "polymixer.bench.distill",
                    "Train the tiny attention teacher, distil it into the hybrid and all-PoM patterns within a quarter "
                    "of its training tokens, and train the same students from scratch on that budget; val loss vs "
                    "tokens."),
        "faults": ("fault injection into training: SIGKILL, SIGTERM, truncated checkpoint, NaN loss; every family",
                   "polymixer.bench.faults",
                   "Train a tiny preset of each family once uninterrupted and again under faults (SIGKILL at random "
                   "moments, some inside a checkpoint write; SIGTERM; a truncated newest checkpoint; a NaN loss), "
                   "resuming each time; report faults survived, steps lost and whether the final weights are "
                   "bit-identical."),
        "recall": ("MQAR recall: accuracy vs state size for PoM, value-carrying PoM, attention, Based, …",
                   "polymixer.bench.recall",
                   "Zoology's multi-query associative recall: 2-layer models of many mixers trained on MQAR, accuracy "
                   "against state floats per layer (L = 64, K = 16) and against sequence length, several seeds."),
        "image": ("diffusion transformers: seconds per image vs image side, quality at equal budget",
                  "polymixer.bench.image",
                  "Forward time of SiT vs SiPoM across image sizes, and SiT vs SiPoM trained with equal steps."),
        "ocr": ("handwriting recognition: lines/s vs page length, quality at equal budget", "polymixer.bench.ocr",
                "Throughput of HTR-VT / HTR-VPoM / hybrid at paper size on lines and pages of 2 to 16 lines, and "
                "CER / WER of the tiny presets trained with equal steps."),
        "eo": ("satellite time series: km²/s vs window side, quality at equal budget, whole patches",
               "polymixer.bench.eo",
               "Throughput of TSViT / TSViPoM / hybrid at paper size on windows of 24 to 128 pixels, and OA / mIoU "
               "of the tiny presets trained with equal steps, evaluated on windows and whole patches."),
        "3d": ("point clouds: 10⁶ points/s vs scene size and patch size, sparse conv, quality at equal budget",
               "polymixer.bench.ptv3",
               "Throughput of PTv3 / PPoMv3 / hybrid at paper size on scenes of 10k to 160k voxels with patches of "
               "1,024 to the whole scene, the sparse convolution's backward, and mIoU of the tiny presets trained "
               "with equal steps."),
    },
}


def _load(target: str) -> Tuple[Callable, Callable]:
    """``module`` (functions add_arguments / main) or ``module:name`` (add_<name>_arguments / main_<name>)."""
    import importlib

    module, _, name = target.partition(":")
    mod = importlib.import_module(module)
    if name:
        return getattr(mod, f"add_{name}_arguments"), getattr(mod, f"main_{name}")
    return mod.add_arguments, mod.main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polymixer", description="The Polynomial Mixer: models, training, "
                                     "generation, evaluation and benchmarks.")
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)
    for verb, nouns in COMMANDS.items():
        if "" in nouns:  # a verb without a noun, e.g. `polymixer generate`
            short, module, desc = nouns[""]
            vp = verbs.add_parser(verb, help=short, description=desc,
                                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)
            _load(module)[0](vp)
            vp.set_defaults(_module=module, noun="")
            continue
        vp = verbs.add_parser(verb, help=f"{verb} ({', '.join(nouns)})")
        sub = vp.add_subparsers(dest="noun", metavar="<what>", required=True)
        for noun, (short, module, desc) in nouns.items():
            np_ = sub.add_parser(noun, help=short, description=desc,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
            _load(module)[0](np_)
            np_.set_defaults(_module=module)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    _, run = _load(args._module)
    try:
        return int(run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, FloatingPointError) as e:
        print(f"polymixer {args.verb}{' ' + args.noun if args.noun else ''}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
