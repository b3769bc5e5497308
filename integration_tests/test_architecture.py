"""The shape of the source: no import cycle in any package (function-level imports
included) and no module over 450 lines in any package's src.

import-linter (``.importlinter``) checks the layers between modules, but it follows only
module-level imports; an import inside a function hides a cycle from it, so this test
reads every import statement of every module with ``ast``.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = 450


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for src in sorted(ROOT.glob("packages/*/src")):
        for f in sorted(src.rglob("*.py")):
            parts = list(f.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = f
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def _imports(module: str, path: pathlib.Path) -> set[str]:
    """Every palladium module ``module`` imports, anywhere in its body (not under
    ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(r for a in node.names if (r := _resolve(a.name)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in MODULES else _resolve(base) or "")
    found.discard("")
    found.discard(module)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_function_level_cycle():
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert _cycles(graph) == [["a", "b"]]


def test_no_import_cycle_in_any_package_function_level_imports_included():
    assert len(MODULES) > 50
    graph = {m: _imports(m, p) for m, p in MODULES.items()}
    cycles = _cycles(graph)
    detail = [{m: sorted(graph[m] & set(c)) for m in c} for c in cycles]
    assert cycles == [], detail
@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_450_lines(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module]}: {lines} lines; split it by job"


# The classes of palladium.interpret's process-wide state; only process_state makes them.
_STATE_CLASSES = {"FailureLog", "RaceLog", "RendezvousRegistry", "SingleThreadLimit",
                  "RuleRegistry", "ProcessLayouts", "SegmentExecutables"}


def _instantiations(path: pathlib.Path) -> set[str]:
    """The state classes ``path`` makes instances of (a call, or a dataclass field's
    ``default_factory``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        makers = []
        if isinstance(node, ast.Call):
            makers.append(node.func)
            makers += [k.value for k in node.keywords if k.arg == "default_factory"]
        for m in makers:
            name = ast.unparse(m).rpartition(".")[2]
            if name in _STATE_CLASSES:
                found.add(name)
    return found


def test_process_wide_state_is_made_only_in_process_state():
    makers = {m: made for m, p in MODULES.items() if (made := _instantiations(p))}
    assert makers == {"palladium.interpret.state.process_state": _STATE_CLASSES}, makers


# Modules whose leading underscore marks them as a package's internal seam, meant to be
# imported by the package's other modules (every jax._src name, the version string).
_SHARED_PRIVATE_MODULES = {"_jax_compat", "_version"}


def _private_imports(path: pathlib.Path, module: str) -> list[str]:
    """``from other import _name`` in ``path``: a private name of another module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if not node.module.startswith("palladium") or node.module == module:
            continue
        for alias in node.names:
            name = alias.name
            if (name.startswith("_") and not name.startswith("__")
                    and name not in _SHARED_PRIVATE_MODULES):
                found.append(f"{node.module}.{name} (line {node.lineno})")
    return found


def test_no_module_imports_another_modules_private_names():
    offenders = {m: found for m, p in MODULES.items() if (found := _private_imports(p, m))}
    assert offenders == {}, offenders


def test_the_private_import_check_finds_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from palladium.race_detect.boxes import _hidden, box_of\n"
                 "from palladium.interpret import _jax_compat as jc\n")
    assert _private_imports(f, "palladium.other") == ["palladium.race_detect.boxes._hidden (line 1)"]


# The packages whose modules may touch no other object's ``_`` members: a ``_name`` read
# on anything but ``self``/``cls`` must be one the module itself defines (its classes'
# attributes and slots, its functions), and a palladium module's ``_name`` is never read
# through the module (``import x; x._y`` is the private import above by another road).
# The ``_jax_compat`` modules are the one home of jax's private names.
_NO_PRIVATE_REACH = ("race_detect", "shared_memory", "interpret", "pipeline")


def _own_names(tree: ast.AST) -> set[str]:
    """The names a module defines: functions, classes, assigned names, attributes it
    sets or reads on ``self``/``cls``, ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id in ("self", "cls")):
            names.add(node.attr)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names.update(c.value for c in ast.walk(node.value)
                         if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return names


def _imported_modules(tree: ast.AST) -> dict[str, bool]:
    """The names a module binds to imported modules: name -> whether it is palladium's."""
    bound: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound[a.asname or a.name.partition(".")[0]] = a.name.startswith("palladium")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                if f"{node.module}.{a.name}" in MODULES:
                    bound[a.asname or a.name] = True
    return bound


def _private_reaches(path: pathlib.Path) -> list[str]:
    """``x._name`` in ``path`` where ``x`` is another object than ``self``/``cls`` and
    ``_name`` is not the module's own, or ``x`` is a palladium module."""
    tree = ast.parse(path.read_text())
    own, modules = _own_names(tree), _imported_modules(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__"):
            continue
        base = node.value.id if isinstance(node.value, ast.Name) else None
        if base in ("self", "cls"):
            continue
        if base in modules:
            if modules[base]:
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
            continue  # another library's module: its own business
        if name not in own:
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_no_module_reaches_into_another_objects_private_members():
    offenders = {
        m: found for m, p in MODULES.items()
        if m.split(".")[1] in _NO_PRIVATE_REACH and "_jax_compat" not in m
        and (found := _private_reaches(p))
    }
    assert offenders == {}, offenders


def test_the_private_reach_check_finds_them(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "from palladium.interpret.eval import memory\n"
        "import threading\n"
        "class Rounds:\n"
        "    __slots__ = ('_owned',)\n"
        "    def stall(self, sim, other):\n"
        "        self._owned = other._owned\n"  # the module's own class's member: fine
        "        sim._det.acquire(sim._actor(0))\n"
        "        memory._checked()\n"
        "        threading._DummyThread\n"
    )
    assert sorted(_private_reaches(f)) == [
        "memory._checked (line 8)", "sim._actor (line 7)", "sim._det (line 7)"]


def test_docs_architecture_names_every_module():
    """docs/architecture.md's tables match the tree: every module of every package's
    src is named there (by its path within the package, or its file name)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = []
    for src in sorted(ROOT.glob("packages/*/src/palladium/*")):
        if not src.is_dir():
            continue
        for f in sorted(src.rglob("*.py")):
            rel = f.relative_to(src).as_posix()
            if f.name in ("__init__.py", "_version.py"):
                continue
            named = (f"`{rel}`", f"`{f.name}`", f"`{src.name}/{rel}`")
            if not any(n in doc for n in named):
                missing.append(f"{src.name}/{rel}")
    assert missing == [], missing


# Only ``palladium.interpret.compiled`` builds traced computations of a kernel body: the
# one traced evaluator (``compiled/traced_eval.py``, one rule table over the traced
# state) is the home of lax's control flow and dynamic slices and of compiling for the
# CPU (``compile_traced``); compiled segments and compiled launches are that evaluator,
# every other module of the interpreter is the simulator or asks it.
_TRACED_BUILDERS = {"scan", "while_loop", "fori_loop", "switch", "cond", "dynamic_slice",
                    "dynamic_update_slice"}
#: Modules that compile the *user's* function, not a kernel body: ``predict`` lowers and
#: compiles the call it is asked about once (issue 40, item 4).
_USER_FUNCTION_COMPILERS = {"palladium.interpret.tune.predict"}


def _traced_builds(path: pathlib.Path) -> list[str]:
    """``lax.<control flow or dynamic slice>(...)`` and ``<x>.compile()`` calls in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        f = node.func
        if ((f.attr in _TRACED_BUILDERS and ast.unparse(f.value) in ("lax", "jax.lax"))
                or (f.attr == "compile" and not node.args and not node.keywords)):
            found.append(f"{ast.unparse(f)} (line {node.lineno})")
    return found


def test_only_compiled_builds_traced_computations():
    offenders = {m: found for m, p in MODULES.items()
                 if m.startswith("palladium.interpret.")
                 and not m.startswith("palladium.interpret.compiled.")
                 and m not in _USER_FUNCTION_COMPILERS
                 and (found := [f for f in _traced_builds(p)
                                if not (m in _USER_FUNCTION_COMPILERS and ".compile" in f)])}
    assert offenders == {}, offenders
    builders = {m for m, p in MODULES.items() if _traced_builds(p)
                and m.startswith("palladium.interpret.")}
    assert {"palladium.interpret.compiled.traced_eval",
            "palladium.interpret.compiled.traced_state"} <= builders, builders


def test_the_traced_build_check_finds_them(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import re\nfrom jax import lax\nimport jax\n"
                 "lax.scan(f, c, xs)\njax.lax.dynamic_slice(x, s, n)\n"
                 "jax.jit(f).lower(x).compile()\nre.compile('a')\nlax.add(x, y)\n")
    assert _traced_builds(f) == ["lax.scan (line 4)", "jax.lax.dynamic_slice (line 5)",
                                 "jax.jit(f).lower(x).compile (line 6)"]


def test_compiled_segments_and_launches_share_the_traced_evaluator():
    """One rule table: the segment and the launch functions trace through
    ``traced_eval`` and define no rule of their own."""
    for name in ("segment_function", "launch_function"):
        path = MODULES[f"palladium.interpret.compiled.{name}"]
        assert "palladium.interpret.compiled.traced_eval" in _imports(
            f"palladium.interpret.compiled.{name}", path)
        assert "RULES" not in {t.id for node in ast.walk(ast.parse(path.read_text()))
                               if isinstance(node, ast.Assign) for t in node.targets
                               if isinstance(t, ast.Name)}
