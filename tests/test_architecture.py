"""What docs/architecture.md says of the package holds: its layers, the way imports run, sizes, every module listed."""

import ast
import pathlib

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
    "tensorflow": {"core", "check", "tensorflow"},
    "torch": {"core", "check", "torch"},
    "jax": {"core", "check", "jax"},
    # The root's entry points may use any layer (the CLI reads, the demo trains); nothing below imports them,
    # except keras_fit, the Keras fit rules both Keras backends share (Keras only, no framework).
    "": {"", "core", "check", "findings", "reader", "tensorflow", "torch", "jax"},
}
ROOT_MODULES_IMPORTED_BELOW = {"keras_fit"}
FRAMEWORKS = ("tensorflow", "torch", "jax")
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
        for imported in _imports(path):
            target = imported if imported in modules or imported == "" else imported.rpartition(".")[0]
            target_layer = _layer(target) if target else ""
            if target in ROOT_MODULES_IMPORTED_BELOW or target.split(".")[0] in ROOT_MODULES_IMPORTED_BELOW:
                continue
            if target_layer not in ALLOWED[_layer(name)]:
                wrong.append(f"{name} imports {imported}")
    assert not wrong, "imports against the layers: " + "; ".join(wrong)


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


def test_every_framework_has_its_subpackage_with_parallel_names():
    modules = _modules()
    for framework in FRAMEWORKS:
        assert f"{framework}.writer" in modules and f"{framework}.check" in modules, framework
    assert "tensorflow.keras" in modules and "jax.keras" in modules
    assert "tensorflow.evaluator" in modules and "torch.evaluator" in modules


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
