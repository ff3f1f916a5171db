"""What docs/architecture.md says of the package holds: the imports between its modules form no cycle, and every module is listed."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tb_gradcheck"


def _imports():
    """``{module: set of tb_gradcheck modules it imports at its top level}``."""
    graph = {}
    for path in sorted(PACKAGE.glob("*.py")):
        found = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module == "tb_gradcheck":
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tb_gradcheck."):
                found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("tb_gradcheck."))
        graph[path.stem] = found
    return graph


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


def test_module_imports_form_no_cycle():
    graph = _imports()
    graph.pop("__init__")  # the package re-exports the public names; nothing imports it back
    assert graph["diagnose"] >= {"finding", "optimizer_findings"}  # the parser sees real imports
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_architecture_lists_every_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [p.name for p in PACKAGE.glob("*.py") if p.stem != "__init__" and f"`{p.name}`" not in text]
    assert not missing, f"docs/architecture.md does not list {missing}"
