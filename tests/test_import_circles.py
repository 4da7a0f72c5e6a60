"""No import circle inside pdmask but the documented one, read from the source with ``ast``.

Every import counts, at module level, inside a function or under ``TYPE_CHECKING``: a circle of
deferred imports still ties the modules' designs together (neither can be read, moved or tested
without the other). The one allowed circle is verl's plugin loop (``backends/verl/loss.py``
imports the plugin, which registers the losses, so that they are registered even where verl's
plugin discovery is off; the plugin imports the loss on its first call).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "pdmask"
ALLOWED = [{"pdmask.backends.verl.loss", "pdmask.backends.verl.plugin"}]


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts).removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _targets(module: str, node: ast.AST) -> set[str]:
    """The pdmask modules an import statement of ``module`` imports."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in MODULES}
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:  # relative: from the module's package, ``level`` - 1 packages up
        package = module.split(".")
        if MODULES[module].name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, *([node.module] if node.module else [])])
    else:
        base = node.module or ""
    out = set()
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        out.add(submodule if submodule in MODULES else base)
    return out & set(MODULES)


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = set().union(*(_targets(module, node) for node in ast.walk(tree)))
        graph[module] = edges - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_but_the_verl_plugin_loop():
    found = circles(import_graph())
    unexpected = [sorted(c) for c in found if c not in ALLOWED]
    assert not unexpected, "\n".join(" <-> ".join(c) for c in unexpected)


def test_the_scan_finds_a_circle_of_deferred_and_relative_imports():
    graph = import_graph()
    assert {"pdmask.backends.verl.loss", "pdmask.backends.verl.plugin"} in circles(graph)
    graph["pdmask.trust_region.stats"] = graph["pdmask.trust_region.stats"] | {
        "pdmask.trust_region.logits_pass"
    }
    graph["pdmask.trust_region.logits_pass"] = graph["pdmask.trust_region.logits_pass"] | {
        "pdmask.trust_region.stats"
    }
    assert any("pdmask.trust_region.stats" in c for c in circles(graph))


def test_relative_and_function_level_imports_are_edges(tmp_path):
    source = "def f():\n    from . import triton_pass\n    from .logits_pass import upstream\n"
    module = "pdmask.trust_region.compiled_pass"
    edges = set().union(*(_targets(module, n) for n in ast.walk(ast.parse(source))))
    assert edges == {"pdmask.trust_region.triton_pass", "pdmask.trust_region.logits_pass"}
