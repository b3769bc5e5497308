"""The docs name what exists: every file path, every ``palladium.x.y`` name and every
section of benchmarks/README.md or benchmarks/LOG.md they cite is there (issue 43).

Modules move and get renamed; a doc that names the old place misleads a new maintainer
more than one that names none. This test reads the docs as text (no import), so it runs
anywhere the repository is checked out:

- a path ending in ``.py`` (``palladium/interpret/perf/model.py``, ``eval/program.py``,
  ``tests/_launch_harness.py``, a bare ``grid_loop.py``) must be the tail of a file of the
  repository (a bare name: some file's name);
- a place named from a known folder (``compiled/``, ``docs/ci.md``, ``run/launch.Launch``,
  ``hook/jax_hook._execute``) must be a folder or file, or a module and a name defined at
  its top level;
- a dotted ``palladium.<package>...`` name must be a module, or a module and a name it
  defines at its top level (``palladium.interpret.register_interpret_rule``), or an
  entry-point group a ``pyproject.toml`` declares (``palladium.interpret_rules``);
- a section cited as ``benchmarks/LOG.md, "round 2"`` (README.md or LOG.md, the title in
  quotes, in docs, READMEs and docstrings) must be (part of) a heading of that file.
"""

from __future__ import annotations

import ast
import functools
import os
import pathlib
import re
import tomllib

import pytest
from test_architecture import MODULES  # every palladium module by dotted name

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: The docs whose paths and module names are checked.
DOCS = sorted(
    [*ROOT.glob("docs/*.md"), ROOT / "benchmarks" / "README.md", ROOT / "README.md",
     *ROOT.glob("packages/*/README.md")])

#: Where a cited benchmark section may be named: the docs, the benchmark scripts and
#: every package's source (docstrings).
CITERS = sorted([*DOCS, ROOT / "benchmarks" / "LOG.md", *ROOT.glob("benchmarks/**/*.py"),
                 *ROOT.glob("packages/*/src/**/*.py")])

_SKIP_DIRS = {".git", ".nox", ".venv", "venv", "__pycache__", "build", "dist",
              "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache"}

#: Names that look like the repository's but are not, each with why.
NOT_IN_THE_REPOSITORY = {
    "palladium/__init__.py": "named as what no distribution ships (PEP 420 namespace)",
    "race.py": "the README's race example, saved under that name by the reader",
    "test_kernels.py": "the pytest plugin's example, the reader's test file",
    "palladium.races": "an attribute of the pytest plugin's `palladium` fixture",
    "palladium.launches": "an attribute of the pytest plugin's `palladium` fixture",
}

# A path: at least one character before ".py", not inside a longer word or URL, and not
# a source line of an example's message ("kernel.py:41").
_PATH = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)*[\w-][\w.-]*\.py)(?![\w/]|:\d)")
#: The folders a place in the repository is named from: the repository's own, the
#: packages' and interpret's layers ("eval/program.py", "hook/jax_hook._execute"); not
#: "palladium/", which also starts the key-value store's keys (docs/multi-host.md).
FOLDERS = ("packages", "benchmarks", "examples", "integration_tests", "tests", "docs",
           "tools", "interpret", "shared_memory", "race_detect", "pipeline",
           "race-detect", "shared-memory", "hook", "kernel", "run", "eval", "compiled",
           "fidelity", "perf", "tune", "state", "observe", "numpy_rules", "_jax_compat")
# A place: a folder, a file, or a module with a name in it ("compiled/compiled_launch.STATS"),
# not a pattern ("eval/rules_*", "packages/<name>/").
_PLACE = re.compile(r"(?<![\w./:-])((?:" + "|".join(FOLDERS) + r")/[\w./-]*)([*<{]?)")
_EXTENSIONS = {"py", "md", "json", "toml", "txt", "png", "ini", "cfg", "sh", "yaml", "yml"}
_MODULE = re.compile(r"(?<![\w.])palladium(?:\.[A-Za-z_]\w*)+")
_CITATION = re.compile(
    r"(?:benchmarks/(README)|(?:benchmarks/)?(LOG))\.md`?\)?[,;:]?\s*(?:\(|section\s+)?\"([^\"]+)\"")


@functools.cache
def _repository_files() -> tuple[str, ...]:
    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".")
                   and not d.endswith(".egg-info")]
        rel = pathlib.Path(top).relative_to(ROOT).as_posix()
        found.extend(f if rel == "." else f"{rel}/{f}" for f in files)
    return tuple(found)


@functools.cache
def _repository_folders() -> frozenset[str]:
    return frozenset(f.rpartition("/")[0] for f in _repository_files())


def _folder_exists(path: str) -> bool:
    """``path`` is a folder of the repository or a module without its ".py"."""
    return _path_exists(path + ".py") or any(
        d == path or d.endswith("/" + path) for d in _repository_folders())


def _place_exists(place: str) -> bool:
    """``place`` (as `_PLACE` finds it) is a folder or file of the repository, or a
    module of it without ".py", followed by names the module defines at its top level."""
    place = place.rstrip(".-")
    if place.endswith("/"):
        return _folder_exists(place.rstrip("/"))
    folder, _, last = place.rpartition("/")
    name, *attrs = last.split(".")
    if attrs and attrs[0] in _EXTENSIONS:
        return _path_exists(f"{folder}/{name}.{attrs[0]}")
    if _folder_exists(f"{folder}/{name}") and not attrs:
        return True
    module = f"{folder}/{name}.py"
    if not _path_exists(module):
        return False
    if not attrs:
        return True
    src = [m for m, f in MODULES.items()
           if f.as_posix().endswith("/" + module) and "/src/" in f.as_posix()]
    return not src or any(attrs[0] in _top_level_names(m) for m in src)


def _path_exists(path: str) -> bool:
    """``path`` is the tail of a file's path in the repository (a bare name: its name)."""
    path = path.removeprefix("./")
    return any(f == path or f.endswith("/" + path) for f in _repository_files())




def _entry_point_groups() -> set[str]:
    groups: set[str] = set()
    for project in ROOT.glob("packages/*/pyproject.toml"):
        data = tomllib.loads(project.read_text())
        groups.update(data.get("project", {}).get("entry-points", {}))
    return groups


def _exported(module: str) -> set[str]:
    """The names in ``module``'s ``__all__`` (a list of string literals)."""
    for node in ast.parse(MODULES[module].read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return set()


@functools.cache
def _top_level_names(module: str) -> frozenset[str]:
    """The names ``module`` defines or imports at its top level (inside ``if`` and
    ``try`` too), and its subpackages' modules."""
    tree = ast.parse(MODULES[module].read_text())
    names: set[str] = {m.rpartition(".")[2] for m in MODULES
                       if m.rpartition(".")[0] == module}
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.names[0].name == "*":
            names.update(_exported(node.module or ""))  # what the star import brings
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):
            todo.extend([*node.body, *node.orelse, *getattr(node, "finalbody", []),
                         *(s for h in getattr(node, "handlers", []) for s in h.body)])
    return frozenset(names)


def _module_exists(name: str) -> bool:
    name = name.rstrip(".")
    if name in MODULES or name in _entry_point_groups():
        return True
    module, _, rest = name, "", ""
    while module and module not in MODULES:
        module, _, last = module.rpartition(".")
        rest = f"{last}.{rest}" if rest else last
    if not module or module == "palladium":
        return False
    return rest.partition(".")[0] in _top_level_names(module)


def _unwrapped(text: str) -> str:
    """The text with Markdown's and docstrings' line breaks inside a sentence undone."""
    return re.sub(r"\s*\n\s*", " ", text)


def _missing_places(doc: pathlib.Path) -> list[str]:
    """The paths and places ``doc`` names that the repository does not have."""
    text = re.sub(r"https?://\S+", "", doc.read_text())
    paths = {p for p in _PATH.findall(text) if not _path_exists(p)}
    places = {p for p, pattern in _PLACE.findall(text) if not pattern and not _place_exists(p)}
    return sorted((paths | places) - NOT_IN_THE_REPOSITORY.keys())


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_doc_names_exists(doc):
    missing = _missing_places(doc)
    assert missing == [], f"{doc.relative_to(ROOT)} names what does not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_palladium_module_a_doc_names_exists(doc):
    named = set(_MODULE.findall(doc.read_text()))
    missing = sorted(m for m in named
                     if not _module_exists(m) and m not in NOT_IN_THE_REPOSITORY)
    assert missing == [], f"{doc.relative_to(ROOT)} names modules that do not exist: {missing}"


def _headings(name: str) -> list[str]:
    text = (ROOT / "benchmarks" / f"{name}.md").read_text()
    return [_unwrapped(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)]


def test_every_cited_benchmark_section_exists():
    headings = {name: _headings(name) for name in ("README", "LOG")}
    missing = []
    for citer in CITERS:
        for readme, log, title in _CITATION.findall(_unwrapped(citer.read_text())):
            name = readme or log
            if not any(title in h for h in headings[name]):
                missing.append(f"{citer.relative_to(ROOT)}: {name}.md \"{title}\"")
    assert missing == [], missing


def test_the_checks_find_what_does_not_exist(tmp_path):
    """The checks are not vacuous: each finds a made-up name and accepts a real one."""
    assert _path_exists("palladium/interpret/eval/program.py")
    assert _path_exists("eval/program.py") and _path_exists("grid_loop.py")
    assert not _path_exists("interpret/launch.py")  # run/launch.py since the folders
    assert not _path_exists("no_such_module.py")
    assert _folder_exists("interpret/compiled") and _folder_exists("interpret/run/launch")
    assert not _folder_exists("interpret/launch")
    assert _place_exists("hook/jax_hook._execute") and _place_exists("docs/ci.md.")
    assert _place_exists("compiled/") and _place_exists("interpret/eval")
    assert not _place_exists("hook/jax_hook._no_such_function")
    assert not _place_exists("eval/no_such_module.run") and not _place_exists("docs/gone.md")
    assert _module_exists("palladium.interpret.eval.program")
    assert _module_exists("palladium.interpret.register_interpret_rule")
    assert _module_exists("palladium.interpret_rules")  # pipeline's entry-point group
    assert not _module_exists("palladium.interpret.jax_hook")  # hook/jax_hook.py
    assert not _module_exists("palladium.interpret.no_such_name")
    doc = _written(tmp_path, "See `eval/program.py`, `eval/gone.py` and palladium/x/y.py, "
                             "not\nhttps://example.com/z.py; `interpret/jax_hook`, "
                             "`interpret/hook/`, eval/rules_*, read/write, packages/<name>/.\n")
    assert _missing_places(doc) == ["eval/gone.py", "interpret/jax_hook", "palladium/x/y.py"]
    cited = _CITATION.findall(_unwrapped(
        'benchmarks/LOG.md, "round\n  2" and (benchmarks/README.md, "Nothing") and\n'
        'LOG.md ("Deterministic dot"); README.md "not the benchmarks\'"'))
    assert cited == [("", "LOG", "round 2"), ("README", "", "Nothing"),
                     ("", "LOG", "Deterministic dot")]
    assert _missing_places(_written(tmp_path, 'site="kernel.py:41", `race.py`')) == []
    assert _missing_places(_written(tmp_path, "`gone.py`, `run/launch.Gone`")) == [
        "gone.py", "run/launch.Gone"]


def _written(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    return doc
