"""``polymixer <verb> <noun>``: one command-line grammar for every model family.

    polymixer bench mixer [--quick]     PoM vs attention across sequence lengths (table, JSON, PNG)
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, List, Optional, Tuple

# verb → noun → (help, add_arguments, main); each entry imports its module lazily so the CLI starts fast
Command = Tuple[str, str, str]
COMMANDS: Dict[str, Dict[str, Command]] = {
    "bench": {
        "mixer": ("PoM vs attention across sequence lengths at a fixed token budget", "polymixer.bench.mixer",
                  "Time forward and forward+backward of PoM (eager and compiled) against SDPA and naive attention."),
    },
}


def _load(module: str) -> Tuple[Callable, Callable]:
    import importlib

    mod = importlib.import_module(module)
    return mod.add_arguments, mod.main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polymixer", description="The Polynomial Mixer: models, training, "
                                     "generation, evaluation and benchmarks.")
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>", required=True)
    for verb, nouns in COMMANDS.items():
        vp = verbs.add_parser(verb, help=f"{verb} ({', '.join(nouns)})")
        sub = vp.add_subparsers(dest="noun", metavar="<what>", required=True)
        for noun, (short, module, desc) in nouns.items():
            np_ = sub.add_parser(noun, help=short, description=desc,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
            add_arguments, _ = _load(module)
            add_arguments(np_)
            np_.set_defaults(_module=module)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    _, run = _load(args._module)
    try:
        return int(run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"polymixer {args.verb} {args.noun}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
