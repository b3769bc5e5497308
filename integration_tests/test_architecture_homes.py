"""One home per fact (issue 43): each of these facts is written down in one module, and
these tests (reading the source with ``ast``) keep it so.

- the groups of primitives (calls, ref accesses, DMAs): ``eval/primitive_groups.py``;
- the chip names: ``chip.py`` (no ``"v5e"`` literal elsewhere: ``DEFAULT_CHIP``);
- a ref's transform chain and the TPU bitcast: ``eval/refs.py``;
- a kernel's label in messages: ``KernelSpec.named`` (``kernel/kernel_spec.py``).
"""

from __future__ import annotations

import ast
import pathlib
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
INTERPRET = ROOT / "packages" / "interpret" / "src" / "palladium" / "interpret"


def _interpret_modules() -> dict[str, pathlib.Path]:
    return {f.relative_to(INTERPRET).as_posix(): f for f in sorted(INTERPRET.rglob("*.py"))}


MODULES = _interpret_modules()


def _written_once(find: Any, home: str, exempt: tuple[str, ...] = ()) -> None:
    """``find(path)`` finds something in ``home`` and in no other module (but those
    whose path starts with one of ``exempt``)."""
    offenders = {m: found for m, p in MODULES.items()
                 if m != home and not m.startswith(exempt) and (found := find(p))}
    assert offenders == {}, offenders
    assert find(MODULES[home])

# --- the primitive groups ---------------------------------------------------------------
#: The primitives the groups of ``eval/primitive_groups.py`` name (their jax names).
_GROUPED = {"get", "swap", "addupdate", "load", "masked_swap", "dma_start", "dma_wait",
            "jit", "pjit", "custom_jvp_call", "custom_vjp_call", "closed_call", "remat",
            "remat2", "checkpoint"}
_GROUPS_HOME = "eval/primitive_groups.py"
#: perf/costs.py's per-primitive cost classes are by name, and are the performance
#: model's own tables (being recalibrated): named here so that a new table is a decision.
_NAMED_ELSEWHERE = {"perf/costs.py"}


def _grouped_member(node: ast.AST) -> str | None:
    """The grouped primitive ``node`` names: ``jc.get_p``-like, or a string ``"get"``."""
    if isinstance(node, ast.Attribute) and node.attr.endswith("_p"):
        name = node.attr[:-2]
        return name if name in _GROUPED or f"{name}2" in _GROUPED else None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value if node.value in _GROUPED else None
    return None


def _groups_defined(path: pathlib.Path) -> list[str]:
    """Literal tuples, lists, sets and dict keys in ``path`` that name two or more of the
    grouped primitives (a group written out again)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        names = {n for item in items if (n := _grouped_member(item))}
        if len(names) >= 2:
            found.append(f"{sorted(names)} (line {node.lineno})")
    return found


def test_the_primitive_groups_are_defined_once():
    _written_once(_groups_defined, _GROUPS_HOME, tuple(_NAMED_ELSEWHERE))


def test_the_group_check_finds_a_group_written_out(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from palladium.interpret import _jax_compat as jc\n"
                 "_CALLS = (jc.jit_p, jc.custom_jvp_call_p)\n"
                 "ONE = (jc.scan_p, jc.get_p)\n"
                 "SKIP = {'get': 1, 'swap': 2}.get\n")
    assert _groups_defined(f) == ["['custom_jvp_call', 'jit'] (line 2)",
                                  "['get', 'swap'] (line 4)"]


# --- the chip names ---------------------------------------------------------------------
_CHIP_HOME = "chip.py"
#: perf/model.py's per-chip constants (clock, ICI bandwidth) are the performance model's
#: own tables, keyed by chip name.
_CHIP_TABLES_ELSEWHERE = {"perf/model.py"}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _chip_literals(path: pathlib.Path, chip: str = "v5e") -> list[int]:
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value == chip and id(n) not in docs]


def test_no_chip_name_literal_outside_chip_py():
    _written_once(_chip_literals, _CHIP_HOME, tuple(_CHIP_TABLES_ELSEWHERE))


def test_the_chip_literal_check_skips_docstrings(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""On a "v5e"."""\ndef f(chip="v5e"):\n    """v5e"""\n    return "v5e"\n')
    assert _chip_literals(f) == [2, 4]


# --- what the TPU compiler rejects ------------------------------------------------------
#: The folders that run kernels: what they find the compiler rejects, they ask
#: ``fidelity/compiler_rejects.py`` (or the approximation's rules) about.
_RUNNING = ("eval/", "compiled/", "kernel/", "run/", "hook/")
#: Words of the compiler's verdicts (its own messages are quoted after them).
_VERDICT_WORDS = ("compiler rejects", "compiler for TPU", "Unimplemented DMA", "Explicit MXU ops")


def _verdicts(path: pathlib.Path) -> list[int]:
    """Lines of ``path`` whose strings (not docstrings) word a compiler verdict."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    return sorted({n.lineno for n in ast.walk(tree)
                   if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and id(n) not in docs and any(w in n.value for w in _VERDICT_WORDS)})


def test_what_the_compiler_rejects_is_decided_only_in_fidelity():
    offenders = {m: lines for m, p in MODULES.items()
                 if m.startswith(_RUNNING) and (lines := _verdicts(p))}
    assert offenders == {}, offenders
    assert _verdicts(MODULES["fidelity/compiler_rejects.py"])


def test_the_verdict_check_finds_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""The compiler rejects nothing here."""\n'
                 'def f(chip):\n    return f"the TPU compiler rejects it on {chip}"\n')
    assert _verdicts(f) == [3]


# --- the process's stores ---------------------------------------------------------------
#: What makes a module-level store: a container, a memo of a function.
_STORE_MAKERS = {"dict", "list", "set", "Counter", "OrderedDict", "defaultdict", "deque",
                 "WeakKeyDictionary", "WeakValueDictionary", "WeakSet", "KeySet"}
_MEMOS = {"functools.cache", "functools.lru_cache", "cache", "lru_cache"}
#: Module-level tables that are registries (filled while the package imports, the same
#: in every process) and memos of pure functions of their arguments (a chip's facts, an
#: installed version): not per-process state.
_NOT_STORES = {
    "compiled/traced_eval.py": {"RULES"},
    "eval/shadow_rules.py": {"SHADOW_RULES"},
    "eval/shadow_propagation.py": {"_SHADOW_OF"},
    "numpy_rules/common.py": {"NUMPY_RULES", "PREFLUSHED_RULES", "DETERMINISTIC_RULES"},
    "fidelity/approx_registry.py": {"_RULES", "_KERNEL_RULES"},
    "hook/ffi_callback.py": {"_REGISTERED"},  # the FFI targets registered with jax
    "_jax_compat/mosaic.py": {"_CPU_ANSWER"},  # the answer installed for tpu_info
    "chip.py": {"chip_facts", "chip_record"},
    "perf/model.py": {"chip_model", "_measured_table"},
    "_jax_compat/__init__.py": {"xla_divides_by_scalar_reciprocal"},
    "fidelity/tpu_compiler.py": {"compiler_version"},
    "fidelity/call_key.py": {"_kept_aval_text"},
    "run/grid_order.py": {"_parallel_orders"},
    "state/environment.py": {"version", "_source_digest", "_host"},
}


def _is_keep(node: ast.AST | None) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "keep")


def _makes_store(node: ast.AST | None) -> bool:
    if isinstance(node, ast.Dict | ast.List | ast.Set):
        return not getattr(node, "keys", None) and not getattr(node, "elts", None)
    if isinstance(node, ast.Call):
        name = ast.unparse(node.func)
        return (name.rpartition(".")[2] in _STORE_MAKERS and not node.args
                or any(name.startswith(m) for m in _MEMOS))
    return False


def _stores(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """(the module-level stores ``path`` makes, the names it registers with ``keep``)."""
    tree = ast.parse(path.read_text())
    made, kept = set(), set()
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets
                     if isinstance(t, ast.Name) and not t.id.startswith("__")}
            if _makes_store(node.value):
                made |= names
            elif _is_keep(node.value):
                kept |= names
        elif isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).split("(")[0] in _MEMOS for d in node.decorator_list):
            made.add(node.name)
    for node in ast.walk(tree):
        if (_is_keep(node) and len(node.args) > 1
                and isinstance(node.args[1], ast.Name | ast.Attribute)):
            kept.add(ast.unparse(node.args[1]).rpartition(".")[2])
    return made, kept


def test_every_module_level_store_is_registered_in_state():
    registered = set().union(*(_stores(p)[1] for p in MODULES.values()))
    offenders = {m: sorted(_stores(p)[0] - registered - _NOT_STORES.get(m, set()))
                 for m, p in MODULES.items() if m != "state/process_state.py"}
    assert {m: v for m, v in offenders.items() if v} == {}


def test_the_store_check_finds_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import functools, weakref\n_A = {}\n_B: dict = STATE.keep('b', {}, owner='m', "
                 "holds='')\n_C = weakref.WeakKeyDictionary()\nK = (1, 2)\n"
                 "@functools.cache\ndef f(x):\n    return x\n")
    assert _stores(f) == ({"_A", "_C", "f"}, {"_B"})


def test_the_docs_name_every_registered_store():
    from palladium.interpret.state.process_state import STATE

    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert len(STATE.stores) > 10
    missing = sorted(name for name in STATE.stores if f"`{name}`" not in doc)
    assert missing == []


# A ref's transform chain (which transforms place the region, which apply to its data)
# and the TPU bitcast's row packing are written once, in ``eval/refs.py``
# (``split_chain``, ``tpu_bitcast``): the simulator and the traced evaluator both use
# them (issue 43: the semantics of a kernel body exist once).
_REFS_HOME = "eval/refs.py"


def _chain_rules(path: pathlib.Path) -> list[int]:
    """Lines of ``path`` that swap a block's two minor dimensions (the packing of a
    bitcast that changes the bit width), and functions that compare a bitcast's width
    (the in-place cast of a chain's leading same-width bitcast)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "swapaxes"):
            found.append(node.lineno)
        if isinstance(node, ast.FunctionDef):
            text = ast.unparse(node)
            if "BitcastTransform" in text and "itemsize" in text:
                found.append(node.lineno)
    return sorted(found)


def test_refs_transform_chains_and_bitcasts_are_written_once():
    _written_once(_chain_rules, _REFS_HOME, ("perf/", "tune/"))


def test_the_chain_rule_check_finds_them(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def lead(t, d):\n    return isinstance(t, jc.BitcastTransform) and "
                 "t.dtype.itemsize == d.itemsize\n"
                 "def post(t, x):\n    return isinstance(t, jc.BitcastTransform) and x\n"
                 "y = x.swapaxes(-1, -2)\n")
    assert _chain_rules(f) == [1, 5]


# How a message names a kernel and where it was launched (``kernel 'name' (file:line)``)
# is written once: ``KernelSpec.named`` (``kernel/kernel_spec.py``).
_LABEL_HOME = "kernel/kernel_spec.py"


def _kernel_labels(path: pathlib.Path) -> list[int]:
    """Functions of ``path`` that word ``kernel '...'`` and test or keep its
    ``launch_location`` (to add it to the label)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef) or "kernel '" not in ast.unparse(node):
            continue
        if any((isinstance(n, ast.If | ast.IfExp) and "launch_location" in ast.unparse(n.test))
               or (isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute)
                   and n.value.attr == "launch_location") for n in ast.walk(node)):
            found.append(node.lineno)
    return found


def test_a_kernel_is_labelled_in_one_place():
    _written_once(_kernel_labels, _LABEL_HOME)


def test_the_label_check_finds_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def where(k):\n    at = k.launch_location\n"
                 "    return f\"kernel '{k.name}'\" + (f\" ({at})\" if at else '')\n"
                 "def ok(k):\n    return f\"kernel '{k.name}'\", k.launch_location\n")
    assert _kernel_labels(f) == [1]
