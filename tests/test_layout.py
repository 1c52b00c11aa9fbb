"""The shape of the house, checked on the source: data flows one way (no module imports one on a floor above it), no
two modules import each other (directly or through others), and no module imports another's private name.

Every ``import`` and ``from … import`` of polymixer counts, at module level or inside a function (a lazy import is
still a dependency). ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of
``pkg`` itself (its ``__init__``)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

import polymixer
from polymixer.families import BUILT_IN

SRC = Path(polymixer.__file__).parent

# floors, lowest first: a module may import its own floor or lower ones. The library (everything outside
# polymixer.experiments) comes first; the lab (polymixer.experiments) sits on top of it, one folder per family whose
# files sit on the floors of their kind (data.py / synth.py, task.py, bench.py). The package's __init__ (the public
# API) and __main__ (the command line's entry) are above everything.
LIBRARY: List[Tuple[str, ...]] = [
    ("families", "import_hooks", "files", "ranges"),  # the family table, import hooks, atomic writes, ranges
    ("ops",),  # the operations: every backend, the dispatcher, the float64 oracles
    ("functional", "reference", "tokenizer"),  # public names of the ops, tokenizers
    ("values", "layers"),  # the token mixers, one class per mixer
    ("blocks",),  # PolyMorpher and the mixer table
    ("models",),  # the registry and one file per family
    ("checkpoint",),  # atomic, verified checkpoints
    ("hf", "pomify"),  # transformers integration and conversion of trained models
]
# floors inside polymixer.ops, lowest first: the shared pieces under the ops' folders, the folders under the package
# (a folder's modules may import one another, never in a cycle)
OPS: List[Tuple[str, ...]] = [
    ("common",),  # non-linearities, checks, packing, rotary positions, the mode keywords
    ("features", "reference", "call", "dispatch", "measured", "triton_common"),  # shared math, the oracles' pieces,
    # the call and the stream state, the dispatcher and its measurements, what the Triton backends share
    ("parallel",),  # context parallelism's collectives
    ("pom", "value_pom"),  # one folder per op: front end, weights, oracle and backends
    ("gated_value_pom",),  # the value PoM with a decay (its call extends the value PoM's)
    ("__init__",),  # polymixer.ops itself: backend_for and the public names
]
LAB: List[Tuple[str, ...]] = [
    # what every family's experiment shares at the bottom, and the families' registry (which finds each family's
    # registration at run time: no module of a family is imported by it)
    ("experiments", "commands", "registry", "report", "metrics", "data", "locks",
     "extras"),
    # a family's loaders and offline default (lm: its BPE tokenizer and the n-gram baseline of its corpora)
    ("data.py", "synth.py", "diffusion.py", "bpe.py", "ngram.py"),
    ("train",),  # the one training loop
    ("tasks", "task.py"),  # the data check and presets; a family's task and commands
    # the benches, the parity judge, the guides' tables; a family's bench, comparisons and guide tables
    ("bench", "guides", "bench.py", "targets.py", "tables.py"),
    ("family.py",),  # a family's registration: the one object that names all its pieces
    ("cli",),  # the command line
]
FLOORS: List[Tuple[str, ...]] = LIBRARY + LAB + [("__main__",), ("__init__",)]
# the folders of the lab that hold a family (the built-in families of the families table) or a task that is not a
# model family (distill: attention language models converted to PoM); their files sit on the floors of their kind
TASK_FOLDERS = ("distill",)
FAMILY_FOLDERS = BUILT_IN + TASK_FOLDERS
# the lab's folders every family shares (their modules, like the lab's shared files, import no family's module)
SHARED_FOLDERS = ("bench", "data", "tasks", "train")


def _modules() -> Dict[str, Tuple[Path, bool]]:
    mods = {}
    for p in SRC.rglob("*.py"):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return mods


def _graph() -> Tuple[Dict[str, Set[str]], List[str]]:
    """{module: modules of polymixer it imports}, and the private names another module imports or reads
    (``from x import _name``, or ``alias._name`` where ``alias`` is an imported module of polymixer)."""
    mods = _modules()
    edges: Dict[str, Set[str]] = {}
    private = []
    for mod, (path, is_pkg) in mods.items():
        out: Set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        aliases: Dict[str, str] = {}  # local name → the polymixer module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in mods:
                        aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in mods and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                private.append(f"{mod} reads {aliases[node.value.id]}.{node.attr}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("polymixer"):
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in mods:
                        out.add(sub)
                        continue
                    out.add(target)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append(f"{mod} imports {target}.{alias.name}")
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("polymixer"))
        out.discard(mod)
        edges[mod] = out
    return edges, private


def _ops_floor(mod: str) -> float:
    """A module's floor inside polymixer.ops (:data:`OPS`), as a fraction of the ops' floor."""
    parts = mod.split(".")
    key = parts[2] if len(parts) > 2 else "__init__"
    for j, names in enumerate(OPS):
        if key in names:
            return j / len(OPS)
    raise AssertionError(f"{mod} is on no floor of tests/test_layout.py: add it to OPS")


def _floor(mod: str) -> float:
    if mod == "polymixer":
        return len(FLOORS) - 1
    parts = mod.split(".")
    top = parts[1]
    if top == "__main__":
        return len(FLOORS) - 2
    if top != "experiments":
        for i, names in enumerate(LIBRARY):
            if top in names:
                return i + (_ops_floor(mod) if top == "ops" else 0)
        raise AssertionError(f"{mod} is on no floor of tests/test_layout.py: add it to LIBRARY")
    key = "experiments" if len(parts) == 2 else parts[2]
    if key in FAMILY_FOLDERS:
        key = "experiments" if len(parts) == 3 else parts[3] + ".py"
    for i, names in enumerate(LAB):
        if key in names:
            return len(LIBRARY) + i
    raise AssertionError(f"{mod} is on no floor of tests/test_layout.py: add it to LAB")


def _family_folder(mod: str) -> str:
    """The family (or task) folder of the lab ``mod`` lives in, "" for a shared module."""
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "experiments" and parts[2] in FAMILY_FOLDERS else ""


def test_the_shared_modules_import_no_family():
    """A family is a plug-in: the command line, the registry, the benches (parity, faults, the README's table), the
    guides' tables, the data check and the training loop find the families through the registry at run time and
    import no module of a family folder, lazily or not; every folder of the lab is shared or a family's (or a
    task's), and every built-in family has its registration."""
    edges, _ = _graph()
    shared = [m for m in edges if m.startswith("polymixer.experiments") and not _family_folder(m)]
    assert "polymixer.experiments.bench.parity" in shared and "polymixer.experiments.cli" in shared
    named = [f"{m} imports {t}" for m in sorted(shared) for t in sorted(edges[m]) if _family_folder(t)]
    assert not named, "\n".join(named)
    lab = SRC / "experiments"
    assert sorted(p.name for p in lab.iterdir() if (p / "__init__.py").is_file() and p.name not in SHARED_FOLDERS) \
        == sorted(FAMILY_FOLDERS), "a folder of the lab is neither shared (SHARED_FOLDERS) nor a family's (or task's)"
    assert all((lab / name / "family.py").is_file() for name in BUILT_IN)


def test_the_library_imports_nothing_from_the_lab():
    """What users import (ops, layers, blocks, models, checkpoint, hf, pomify, …) works without the lab: no module
    outside polymixer.experiments imports one inside it, lazily or not (the command line's entry point aside)."""
    edges, _ = _graph()
    lab = "polymixer.experiments"
    leaks = [f"{m} imports {t}" for m, targets in sorted(edges.items()) if not m.startswith(lab)
             and m != "polymixer.__main__" for t in sorted(targets) if t == lab or t.startswith(lab + ".")]
    assert not leaks, "\n".join(leaks)


def test_every_module_is_on_a_floor_and_imports_none_above_it():
    edges, _ = _graph()
    above = [f"{m} (floor {_floor(m)}) imports {t} (floor {_floor(t)})" for m, targets in sorted(edges.items())
             for t in sorted(targets) if _floor(t) > _floor(m)]
    assert not above, "\n".join(above)


def test_no_two_modules_import_each_other():
    edges, _ = _graph()
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    cycles: List[List[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, f"modules that import each other: {cycles}"


def test_no_module_imports_another_modules_private_name():
    _, private = _graph()
    assert not private, "\n".join(private)


def test_the_checker_sees_lazy_relative_and_private_imports(tmp_path, monkeypatch):
    """The graph is built right: a lazy import inside a function, ``from .. import x`` and a private name count."""
    pkg = tmp_path / "polymixer"
    lm = pkg / "experiments" / "lm"
    lm.mkdir(parents=True)
    for init in (pkg, pkg / "experiments", lm):
        (init / "__init__.py").write_text("")
    (pkg / "functional.py").write_text("def _helper():\n    pass\n")
    (lm / "data.py").write_text("def f():\n    from . import task\n    from ...functional import _helper\n"
                                "    from ... import functional as Fn\n    return Fn._helper\n")
    (lm / "task.py").write_text("from .data import f\n")
    (pkg / "blocks.py").write_text("def g():\n    from .experiments.lm import data\n")
    (pkg / "ops" / "pom").mkdir(parents=True)
    for init in (pkg / "ops", pkg / "ops" / "pom"):
        (init / "__init__.py").write_text("")
    (pkg / "ops" / "features.py").write_text("from . import pom\n")  # shared math reaching up to an op
    monkeypatch.setattr(sys.modules[__name__], "SRC", pkg)
    edges, private = _graph()
    assert edges["polymixer.experiments.lm.data"] == {"polymixer.experiments.lm.task", "polymixer.functional"}
    assert sorted(private) == ["polymixer.experiments.lm.data imports polymixer.functional._helper",
                               "polymixer.experiments.lm.data reads polymixer.functional._helper"]
    with pytest.raises(AssertionError, match="lm.data .* imports polymixer.experiments.lm.task"):
        test_every_module_is_on_a_floor_and_imports_none_above_it()
    with pytest.raises(AssertionError, match=r"polymixer.ops.features \(floor 1.1\d*\) imports polymixer.ops.pom "):
        test_every_module_is_on_a_floor_and_imports_none_above_it()
    with pytest.raises(AssertionError, match="import each other"):
        test_no_two_modules_import_each_other()
    with pytest.raises(AssertionError, match="polymixer.blocks imports polymixer.experiments.lm.data"):
        test_the_library_imports_nothing_from_the_lab()


MAX_FUNCTION_LINES = 80  # from the `def` line to the function's last line, decorators not counted
KERNEL_FILES = ("triton_kernels.py",)  # Triton kernels: one function per launch, long by nature


def _is_triton_kernel(fn: ast.AST) -> bool:
    """Whether ``fn`` is decorated with ``triton.jit`` (bare or called with options)."""
    return any(ast.unparse(d.func if isinstance(d, ast.Call) else d) == "triton.jit"
               for d in getattr(fn, "decorator_list", []))


def _function_lengths() -> Dict[str, int]:
    """{"<path under SRC> <qualified name>": lines} of every function and method in the package (nested ones too),
    except Triton kernels (decorated with ``triton.jit``, or in a file named in KERNEL_FILES)."""
    lengths: Dict[str, int] = {}

    def walk(node: ast.AST, rel: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not _is_triton_kernel(child):
                    lengths[f"{rel} {prefix}{child.name}"] = child.end_lineno - child.lineno + 1
                walk(child, rel, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, rel, f"{prefix}{child.name}.")
            else:
                walk(child, rel, prefix)

    for path in sorted(SRC.rglob("*.py")):
        if path.name not in KERNEL_FILES:
            walk(ast.parse(path.read_text()), path.relative_to(SRC).as_posix(), "")
    return lengths


def _dotted(entry: str) -> str:
    """``"ops/features.py aggregate"`` → ``"polymixer.ops.features.aggregate"``."""
    rel, name = entry.split(" ")
    return ".".join([SRC.name, *Path(rel).with_suffix("").parts, name])


def test_no_function_is_longer_than_80_lines():
    """Code a newcomer reads at once: no function over MAX_FUNCTION_LINES lines outside the Triton kernels."""
    long = [f"{_dotted(k)} ({n} lines)" for k, n in _function_lengths().items() if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: split them\n" + "\n".join(long)


def test_the_length_checker_counts_methods_and_nested_functions_and_skips_kernels(tmp_path, monkeypatch):
    """The walk sees methods and nested functions (by qualified name) and skips ``triton.jit`` kernels and the
    kernel files; the test names a long function by module and counts its lines."""
    pkg = tmp_path / "polymixer"
    (pkg / "ops").mkdir(parents=True)
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))  # with its `def`: one line too many
    (pkg / "ops" / "long.py").write_text(
        f"class A:\n    def short(self):\n        pass\n\n    def method(self):\n{body.replace('    ', '        ')}"
        f"\n\ndef outer():\n    def inner():\n{body.replace('    ', '        ')}    return inner\n"
        f"\n\n@triton.jit\ndef kernel():\n{body}\n\n@triton.jit(do_not_specialize=['n'])\ndef kernel2():\n{body}")
    (pkg / "ops" / "triton_kernels.py").write_text(f"def plain():\n{body}")
    monkeypatch.setattr(sys.modules[__name__], "SRC", pkg)
    lengths = _function_lengths()
    assert lengths == {"ops/long.py A.short": 2, "ops/long.py A.method": 81, "ops/long.py outer": 83,
                       "ops/long.py outer.inner": 81}
    with pytest.raises(AssertionError, match=r"polymixer\.ops\.long\.A\.method \(81 lines\)"):
        test_no_function_is_longer_than_80_lines()


LAYOUT = SRC.parents[1] / "docs" / "layout.md"


def _layout_names(text: str) -> Tuple[Set[str], Set[str]]:
    """The file names (``x.py``, ``ops/measured.json``, ``docs/gpu.md``) and the folder paths (``ops/``,
    ``docs/bench/``) the code block of docs/layout.md names; patterns (``docs/<family>.md``) left out."""
    block = text.split("```")[1]
    files, folders = set(), set()
    for token in re.findall(r"[\w./<>*-]+", block):
        token = token.rstrip(".,:;")
        if "<" in token or "*" in token or "/" not in token and "." not in token:
            continue
        if token.endswith("/"):
            folders.add(token)
        elif re.search(r"\.(py|json|md)$", token):
            files.add(token)
    return files, folders


def test_docs_layout_names_every_file_and_nothing_else():
    """docs/layout.md follows the tree: every module of the package is named there (a family folder's files by their
    kind, each built-in family's model file by "one file per built-in family"), and every file or folder it names
    exists."""
    root = SRC.parent.parent
    files, folders = _layout_names(LAYOUT.read_text())
    names = {Path(f).name for f in files}
    parts = {part for f in folders for part in f.strip("/").split("/")}
    on_disk = [p.relative_to(SRC) for p in SRC.rglob("*") if p.suffix in (".py", ".json")
               and p.name != "__init__.py" and "__pycache__" not in p.parts]
    unnamed = []
    for rel in on_disk:
        folder = rel.parts[:-1]
        if folder == ("models",) and rel.stem in BUILT_IN:
            continue  # models/<family>.py
        if rel.name not in names or not all(part in parts for part in folder):
            unnamed.append(str(rel))
    assert not unnamed, f"files docs/layout.md does not name: {unnamed}"
    basenames = {p.name for p in on_disk} | {"__init__.py"}
    dirs = {p.name for p in SRC.rglob("*") if p.is_dir()}
    missing = [f for f in files if not ((root / f).exists() or (SRC / f).exists() or "/" not in f and f in basenames)]
    missing += [f for f in folders if not ((root / f).is_dir() or (SRC.parent / f).is_dir() or (SRC / f).is_dir()
                                           or all(part in dirs for part in f.strip("/").split("/")))]
    assert not missing, f"names in docs/layout.md that are no file or folder: {missing}"


def test_the_layout_check_sees_an_unnamed_file_and_a_name_of_nothing(tmp_path, monkeypatch):
    """The check above fails on a file the layout leaves out and on a name it gives that is no file."""
    text = LAYOUT.read_text()
    monkeypatch.setattr(sys.modules[__name__], "LAYOUT", tmp_path / "layout.md")
    (tmp_path / "layout.md").write_text(text.replace("import_hooks.py", "import_hook.py", 1))
    with pytest.raises(AssertionError, match=r"does not name: \['import_hooks.py'\]"):
        test_docs_layout_names_every_file_and_nothing_else()
    (tmp_path / "layout.md").write_text(text.replace("  files.py ", "  files.py nowhere.py ", 1))
    with pytest.raises(AssertionError, match=r"no file or folder: \['nowhere.py'\]"):
        test_docs_layout_names_every_file_and_nothing_else()
