"""What docs/architecture.md says of the package holds: its layers, the way imports run, sizes, every module listed."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tb_gradcheck"

# The layers, lowest first. A module may import from its own layer and the layers before it in its
# chain, never after: frameworks depend on the core and the check, the reader on the core and the
# findings, and the reader imports no framework (TensorBoard loads it through an entry point).
CORE = "core"
ALLOWED = {
    "core": {"core"},
    "check": {"core", "check"},
    "findings": {"core", "findings"},
    "reader": {"core", "findings", "reader"},
    # What the Keras callbacks of every backend share, and the choice of the backend's: Keras only.
    "keras": {"core", "keras"},
    "tensorflow": {"core", "check", "keras", "tensorflow"},
    "torch": {"core", "check", "keras", "torch"},
    "jax": {"core", "check", "keras", "jax"},
    # The root's entry points may use any layer (the CLI reads, the demo trains); nothing below imports them.
    "": {"", "core", "check", "findings", "reader", "keras", "tensorflow", "torch", "jax"},
}
# Modules named by a string (importlib, a lazy table) and imported only when used: the Keras package picks
# its backend's callback that way, the one place a framework's module is chosen by name.
NAMED = {"keras": {"tensorflow", "torch", "jax"}}
FRAMEWORKS = ("tensorflow", "torch", "jax")
MODULE_NAME = re.compile(r"tb_gradcheck(\.[a-z_0-9]+)+")
MAX_LINES = 400
MAX_ROOT_MODULES = 8
MAX_SUBPACKAGE_MODULES = 20


def _modules():
    """``{dotted name below tb_gradcheck: path}`` for every module (``core.metadata``, ``cli``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).with_suffix("")
        if "frontend" in relative.parts:
            continue
        found[".".join(relative.parts)] = path
    return found


def _named(path):
    """The tb_gradcheck modules ``path`` names in a string of its code (``importlib.import_module("tb_gradcheck.x")``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value):
            found.add(node.value.split(".", 1)[1])
    return found


def _imports(path):
    """The tb_gradcheck modules ``path`` imports, anywhere in it (function-level imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tb_gradcheck":
            base = node.module.split(".")[1:]
            for alias in node.names:
                found.add(".".join(base + [alias.name]) if base or alias.name != "*" else "")
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".", 1)[1] for a in node.names if a.name.startswith("tb_gradcheck."))
    return found


def _top_level_imports(path):
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tb_gradcheck":
            base = node.module.split(".")[1:]
            found.update(".".join(base + [a.name]) for a in node.names)
    return found


def _layer(name):
    """The subpackage a dotted module name belongs to; "" for the root's modules."""
    parts = name.split(".")
    return parts[0] if len(parts) > 1 or parts[0] in ALLOWED else ""


def _cycle(graph):
    """One import cycle as a list of modules, or None (depth-first search)."""
    state = {}

    def visit(module, path):
        state[module] = "open"
        for other in sorted(graph.get(module, ())):
            if state.get(other) == "open":
                return path[path.index(other) :] + [other]
            if other not in state:
                found = visit(other, path + [other])
                if found:
                    return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return None


def test_imports_run_one_way_between_layers():
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        if name.endswith("__init__") and _layer(name) == "":
            continue  # the package's __init__ re-exports the public names lazily
        layer = _layer(name)
        edges = [(i, ALLOWED[layer]) for i in _imports(path)]
        edges += [(i, ALLOWED[layer] | NAMED.get(layer, set())) for i in _named(path)]
        for imported, allowed in edges:
            target = imported if imported in modules or imported == "" else imported.rpartition(".")[0]
            if (_layer(target) if target else "") not in allowed:
                wrong.append(f"{name} imports {imported}")
    assert not wrong, "imports against the layers: " + "; ".join(wrong)


def test_a_module_named_in_a_string_counts_as_an_import():
    # The Keras package's backend choice is seen, and a framework naming another framework's module is caught.
    modules = _modules()
    assert _named(modules["keras.backends"]) >= {"tensorflow.keras", "jax.keras", "torch.keras"}
    assert not any(
        _layer(t) in ("jax", "torch") for n in modules if _layer(n) == "tensorflow" for t in _named(modules[n])
    )


def test_the_reader_and_the_core_import_no_framework():
    for name, path in _modules().items():
        if _layer(name) not in ("core", "check", "findings", "reader"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for imported in names:
                assert imported.split(".")[0] not in ("tensorflow", "torch", "jax", "keras"), (
                    f"{name} imports {imported}"
                )


def test_module_imports_form_no_cycle():
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        if name == "__init__":
            continue
        graph[name] = {m for m in _top_level_imports(path) if m in modules}
    assert graph["findings.diagnose"] >= {"findings.finding", "findings.optimizer"}  # the parser sees real imports
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_sizes_keep_the_layout_readable():
    modules = _modules()
    long = {n: len(p.read_text().splitlines()) for n, p in modules.items()}
    assert not {n: c for n, c in long.items() if c > MAX_LINES}, f"modules over {MAX_LINES} lines"
    root = [n for n in modules if "." not in n and n != "__init__"]
    assert len(root) <= MAX_ROOT_MODULES, f"the root holds {sorted(root)}"
    for layer in ALLOWED:
        if layer:
            inside = [n for n in modules if n.startswith(layer + ".") and not n.endswith("__init__")]
            assert len(inside) <= MAX_SUBPACKAGE_MODULES, f"{layer}/ holds {len(inside)} modules"


def _parallel_table():
    """docs/architecture.md's table of parallel names: ``{job: {framework: module file name or None}}``."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Parallel names", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 1 + len(FRAMEWORKS) or not cells[0].startswith("`"):
            continue
        names = [re.fullmatch(r"`(\w+)/(\w+\.py)`", c) for c in cells[1:]]
        for framework, match, cell in zip(FRAMEWORKS, names, cells[1:]):
            assert match is None or match.group(1) == framework, f"{cell} under {framework}"
        table[cells[0].strip("`")] = {f: m.group(2) if m else None for f, m in zip(FRAMEWORKS, names)}
    return table


def test_the_parallel_name_table_is_true():
    """Each row names one file name in every framework that has the job, and no shared name is left out."""
    modules = _modules()
    table = _parallel_table()
    assert len(table) >= 4, table
    for job, row in table.items():
        present = {f: n for f, n in row.items() if n}
        assert len(present) >= 2, f"{job}: a parallel name needs two frameworks"
        assert set(present.values()) == {job + ".py"}, f"{job}: {row}"
        for framework, name in present.items():
            assert f"{framework}.{name[:-3]}" in modules, f"{framework}/{name} does not exist"
        for framework, name in row.items():
            assert name or f"{framework}.{job}" not in modules, f"{framework}/{job}.py exists but is not in the table"
    shared = {}
    for name in modules:
        layer, _, stem = name.partition(".")
        if layer in FRAMEWORKS and stem != "__init__":
            shared.setdefault(stem, set()).add(layer)
    missing = {stem for stem, where in shared.items() if len(where) >= 2} - set(table)
    assert not missing, f"modules named alike in two frameworks but not in the table: {sorted(missing)}"


def test_architecture_lists_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = []
    for path in _modules().values():
        if path.stem == "__init__":
            continue
        shown = str(path.relative_to(PACKAGE))
        if f"`{shown}`" not in text:
            missing.append(shown)
    assert not missing, f"docs/architecture.md does not list {missing}"
