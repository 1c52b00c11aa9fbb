"""How a command runs: its module imported on demand (:func:`load_command`), one line and status 2 on bad input, the
process group it joined destroyed at the end; and ``polymixer <verb> <family>`` run through the families' registry
alone (:mod:`polymixer.experiments.registry`, which holds each family's commands)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Optional, Sequence, Tuple

from .extras import missing_extra
from .registry import lab_family

__all__ = ["load_command", "run_command", "process_group_joined", "run_family_command", "COMMAND_ERRORS"]


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
    """``polymixer <verb> <noun> argv…`` through the families' registry alone (no full command-line parser): what a
    wrapper process runs, e.g. ``bench faults``' probe around ``polymixer train <family>``."""
    fam = lab_family(noun)
    add, run = load_command(fam.command(verb).target)
    parser = argparse.ArgumentParser(prog=f"polymixer {verb} {fam.name}")
    add(parser)
    args = parser.parse_args(list(argv))
    args.verb, args.noun = verb, fam.name
    return run_command(run, args, f"{verb} {fam.name}")
