"""What every family's task commands share: the ``--preset`` option, the one-line refusal of another family's preset,
``--set FIELD=VALUE`` (any field of the family's model config, converted by the dataclass's type hints — the one
converter the benches' ``preset+field=value`` variants use too), and the upfront check of a dataset's files
(``polymixer check-data`` and the scan at the start of ``train``)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import types
import typing
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..data.faults import DataCheckError, merge_bad
from ...families import family as family_entry
from ...models import check_overrides, list_models, model_config, preset_of
from ...models.registry import current_name, family_config
from ...ranges import Range
from ..registry import lab_family

__all__ = ["add_preset_argument", "check_preset", "add_data_check_argument", "check_dataset", "scan_dataset",
           "int_at_least", "float_in", "convert_field", "format_field", "add_set_argument",
           "add_field_flags", "field_overrides", "config_overrides", "HELP_PRESET", "shown_preset"]


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ≥ ``low`` — anything else is the parser's one-line error naming the option
    and the range, before any data is read."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer ≥ {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be ≥ {low}, got {value}")
        return value

    return parse


def float_in(allowed: Range) -> Callable[[str], float]:
    """An argparse ``type``: a number in ``allowed`` (:class:`polymixer.ranges.Range`)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number {allowed}, got {text!r}") from None
        if value != value or not allowed.admits(value):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {value:g}")
        return value

    return parse


# the parser default under which the command line hands a train command's parser the preset named before --help
# (``polymixer train lm --preset tiny-hybrid --help``): its help then shows that preset's values
HELP_PRESET = "help_preset"


def shown_preset(p: Any, family: str) -> str:
    """The preset whose values the help of ``p`` (a parser or an argument group) shows: the one the command line
    named before ``--help`` when it is one of ``family``'s, else the family's tiny preset."""
    named = p.get_default(HELP_PRESET)
    try:
        return check_preset(family, named) if named else family_entry(family).tiny
    except ValueError:  # another family's or no preset: the command itself says so when it runs
        return family_entry(family).tiny


def add_preset_argument(p: argparse.ArgumentParser, family: str) -> None:
    """``--preset``, defaulting to the family's tiny preset and listing the family's tiny presets."""
    fam = family_entry(family)
    names = list_models(family=fam.name)
    tiny = [n for n in names if n.startswith("tiny-")]
    p.add_argument("--preset", default=fam.tiny, metavar="NAME",
                   help=f"the model: {', '.join(tiny)} (CPU scale), or one of the {len(names) - len(tiny)} paper-size "
                        f"presets (polymixer.models.list_models(family={fam.name!r})); this help shows "
                        f"{shown_preset(p, family)}'s values: --preset NAME --help shows another's")


def check_preset(family: str, preset: str) -> str:
    """``preset`` if it belongs to ``family``; a one-line ValueError naming its family and the family's presets."""
    return preset_of(family, preset)


# ----------------------------------------------------------------------------------------------------------------
# model-config fields from the command line: --set FIELD=VALUE, and flags named after fields
# ----------------------------------------------------------------------------------------------------------------

NONE_WORDS = ("none", "scene")  # → None where a field allows it ("scene": a whole scene / patch, no window)
TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes"), ("false", "0", "no")


def _field_hints(config_cls: type) -> Dict[str, Any]:
    """Each field of the dataclass and its resolved type hint (``Any`` where it has none)."""
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(config_cls)}


_NOUNS = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "true/false values"),
          str: ("a string", "strings")}


def _is_union(hint: Any) -> bool:
    """``Optional[X]`` / ``Union[X, Y]`` / ``X | None``."""
    return typing.get_origin(hint) in (Union, types.UnionType)


def _describe(hint: Any) -> str:
    """What a value of ``hint`` looks like on the command line ("an integer", "comma-separated integers", "an
    integer or none"), for error messages and help."""
    args = typing.get_args(hint)
    if _is_union(hint):
        return " or ".join([_describe(a) for a in args if a is not type(None)] +
                           (["none"] if type(None) in args else []))
    if typing.get_origin(hint) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"comma-separated {_NOUNS.get(args[0], ('', 'values'))[1]}"
        plural = _NOUNS[args[0]][1] if len(set(args)) == 1 and args[0] in _NOUNS else "values"
        return f"{len(args)} comma-separated {plural}"
    return _NOUNS.get(hint, ("a value",))[0]


def _convert(hint: Any, text: str) -> Any:
    """``text`` as a value of ``hint``; ValueError if it is not one. ``Any``: an integer, a comma-separated tuple
    of such values, none, or the text itself."""
    args = typing.get_args(hint)
    if hint is Any or (_is_union(hint) and type(None) in args):
        if text.strip().lower() in NONE_WORDS:
            return None
    if hint is Any:
        if "," in text:
            return tuple(_convert(Any, t) for t in text.split(","))
        return int(text) if text.strip().lstrip("-").isdigit() else text
    if _is_union(hint):
        for a in (a for a in args if a is not type(None)):
            try:
                return _convert(a, text)
            except ValueError:
                pass
        raise ValueError(text)
    if typing.get_origin(hint) is tuple:
        parts = [t.strip() for t in text.split(",")] if text.strip() else []
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], t) for t in parts)
        if len(parts) != len(args):
            raise ValueError(text)
        return tuple(_convert(a, t) for a, t in zip(args, parts))
    if hint is bool:
        word = text.strip().lower()
        if word not in TRUE_WORDS + FALSE_WORDS:
            raise ValueError(text)
        return word in TRUE_WORDS
    if hint in (int, float, str):
        return hint(text)
    raise ValueError(f"fields of type {hint} cannot be set from text")


def format_field(value: Any) -> str:
    """A config value as ``--set`` writes it (the inverse of :func:`convert_field`): ``none``, ``true`` / ``false``,
    tuples comma-separated."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(format_field, value))
    return str(value)


def _check_field(config_cls: type, name: str) -> Any:
    """The type hint of field ``name`` of ``config_cls``; a one-line ValueError suggesting the closest field (or
    listing them all when none is close)."""
    hints = _field_hints(config_cls)
    name = current_name(config_cls, name)  # an earlier name of a field reads as today's
    if name not in hints:
        close = difflib.get_close_matches(name, list(hints), n=1)
        hint = f"did you mean {close[0]}?" if close else f"its fields: {', '.join(hints)}"
        raise ValueError(f"unknown field {name!r} of {config_cls.__name__}; {hint}")
    return hints[name]


def convert_field(config_cls: type, name: str, text: str) -> Any:
    """The value of field ``name`` of the dataclass ``config_cls`` written as ``text`` on a command line, converted
    by the field's type hint: ints, floats, strings, bools (true/false/1/0/yes/no), tuples as comma-separated values
    (``enc_depths=2,2,2``), ``none`` for None where the field is Optional (or untyped). A one-line ValueError names
    an unknown field (and the closest ones), or the field, the value and the type expected."""
    hint = _check_field(config_cls, name)
    try:
        return _convert(hint, text)
    except ValueError:
        raise ValueError(f"{name} of {config_cls.__name__} must be {_describe(hint)}, got {text!r}") from None


def _assignment(text: str) -> str:
    """An argparse ``type``: ``FIELD=VALUE`` (kept as text; converted once the preset is known)."""
    if "=" not in text or not text.partition("=")[0].strip():
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE (e.g. n_layer=4), got {text!r}")
    return text


def add_set_argument(p: Any, family: str) -> None:
    """``--set FIELD=VALUE`` (repeatable; ``p``: a parser or an argument group): any field of the family's model
    config, over the preset and any flag; :func:`config_overrides` converts them once the preset is known."""
    cls, preset = family_config(family), shown_preset(p, family)
    values = model_config(preset)
    p.add_argument("--set", dest="set_fields", action="append", type=_assignment, default=None,
                   metavar="FIELD=VALUE",
                   help=f"set any field of the model config {cls.__name__} (repeatable: --set a=1 --set b=x), over the "
                        f"preset and the flags; tuples comma-separated, none for None. Its fields, with {preset}'s "
                        f"values: {', '.join(f'{n}={format_field(getattr(values, n))}' for n in _field_hints(cls))}")


def add_field_flags(p: Any, family: str, names: Optional[Sequence[str]] = None) -> None:
    """A flag ``--<field>`` (dest ``m_<field>``) for each field of the family's model config (or ``names``) on
    ``p`` (a parser or an argument group), converted like ``--set``; the help shows the value of the preset
    :func:`shown_preset` names. :func:`field_overrides` reads them back."""
    shown = shown_preset(p, family)
    cls, preset = family_config(family), model_config(shown)
    for name in names if names is not None else list(_field_hints(cls)):
        hint = _check_field(cls, name)

        def parse(text: str, name: str = name) -> Any:
            try:
                return convert_field(cls, name, text)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None

        p.add_argument("--" + name.replace("_", "-"), dest="m_" + name, type=parse, default=None,
                       metavar=name.upper(), help=f"override the preset's {name} ({cls.__name__}.{name}, "
                                                  f"{_describe(hint)}; {shown}: {format_field(getattr(preset, name))})")


def field_overrides(args: argparse.Namespace) -> Dict[str, Any]:
    """The fields given through :func:`add_field_flags`' flags (those left unset are not overrides)."""
    return {k[2:]: v for k, v in vars(args).items() if k.startswith("m_") and v is not None}


def config_overrides(family: str, preset: str, sets: Optional[Sequence[str]],
                     flags: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``flags`` (config fields the family's own options set) then ``["n_layer=4", "mixer=pom"]`` → ``{…, "n_layer":
    4, "mixer": "pom"}``: ``--set`` assignments converted by the types of ``preset``'s config (a preset of ``family``;
    a later assignment of a field wins). The config they make is checked now, before any data is read: one-line
    ValueErrors for another family's preset, an unknown field, a value that does not convert or one its config
    refuses (``n_layer must be ≥ 1, got 0``) or a mixer option no layer of the model takes (``token_shift=4 is taken
    by no mixer of this model (attention A); …``)."""
    check_preset(family, preset)
    cls = family_config(family)
    out: Dict[str, Any] = dict(flags or {})
    for text in sets or ():
        name, eq, value = text.partition("=")
        if not eq:
            raise ValueError(f"--set {text!r}: expected FIELD=VALUE (e.g. n_layer=4)")
        out[name.strip()] = convert_field(cls, name.strip(), value)
    check_overrides(preset, out)  # every field's own check, before a command reads any data
    return out


def add_data_check_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-data-check", action="store_true",
                   help="skip the scan of every data file's header and length before training (a bad file then "
                        "stops the run when it is drawn, or is skipped with --skip-bad-samples)")


def scan_dataset(family: str, data: Any, progress: bool = True, **kw: Any) -> List[Tuple[str, str]]:
    """Every bad file of a dataset of ``family`` with its reason, in one pass over headers and lengths (the
    ``check_data`` of the family's loaders, :attr:`~polymixer.experiments.registry.LabFamily.loaders`); ``data`` is
    what those loaders take (a folder, or the text files of a language model)."""
    loaders = lab_family(family).loaders
    if loaders is None:
        raise ValueError(f"the {family_entry(family).name} family has no dataset files to check")
    module = importlib.import_module(loaders)
    return merge_bad(module.check_data(data, progress=progress, **kw))  # each bad file once, all its reasons


def check_dataset(family: str, data: Any, progress: bool = True, skip_bad_samples: bool = False,
                  **kw: Any) -> List[Tuple[str, str]]:
    """The scan at the start of ``train``: a :class:`~polymixer.experiments.data.faults.DataCheckError` listing every
    bad file
    (unless bad samples are to be skipped: then the list is returned, and the loaders skip them as they meet
    them)."""
    bad = scan_dataset(family, data, progress=progress, **kw)
    if bad and not skip_bad_samples:
        raise DataCheckError(_where(data), bad)
    return bad


def _where(data: Union[str, Path, Sequence[Any], None]) -> str:
    if isinstance(data, (list, tuple)):
        return ", ".join(map(str, data[:3])) + (" …" if len(data) > 3 else "")
    return str(data)
