"""The import layers, read from the source with ``ast`` (nothing is imported).

math <- registry <- tracking <- backends, figures <- analysis, orchestration <- api <- CLI: a
package imports only packages of a lower layer (never one of its own layer or above), so the
math runs without a registry, backends without orchestration, and nothing below the CLI needs
the CLI. And no module reaches into another package's private (``_name``) submodule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "pdmask"

# Layer of each top-level part of pdmask; a part imports only parts of a lower layer.
LAYERS = {
    "errors": 0,
    "console": 0,
    "process_group": 0,
    "loopback": 0,
    "trust_region": 1,  # the math
    "watchdog": 1,  # the progress watchdog of trials and jobs (imports errors)
    "paths": 1,  # the project and state folders (imports errors: a missing PDM_PROJECT)
    "registry": 2,
    "tracking": 3,
    "backends": 4,
    "figures": 4,
    "analysis": 5,
    "orchestration": 5,
    "api": 6,
    "cli": 7,
    "__main__": 8,
}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found.append((".".join(("pdmask", *parts)).removesuffix(".__init__"), path))
    return found


def _imports(path: Path) -> list[tuple[str, int]]:
    """Absolute ``pdmask.*`` modules ``path`` imports, with their line numbers."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "pdmask":
            # `from pdmask import api` imports a part; `from pdmask import __version__` a name
            names = [f"pdmask.{a.name}" for a in node.names if a.name in _parts_on_disk()]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        out += [(name, node.lineno) for name in names if name.startswith("pdmask.")]
    return out


def _parts_on_disk() -> set[str]:
    return {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


MODULES = _modules()


def test_every_part_of_the_package_has_a_layer():
    parts = {_part(module) for module, _ in MODULES} - {""}
    assert parts <= set(LAYERS), f"give {sorted(parts - set(LAYERS))} a layer in LAYERS"


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_point_down_the_layers(module, path):
    own = _part(module)
    if not own:
        return  # the package root re-exports lazily
    wrong = []
    for target, line in _imports(path):
        other = _part(target)
        if other != own and LAYERS[other] >= LAYERS[own]:
            wrong.append(f"{path.name}:{line}: {own} (layer {LAYERS[own]}) imports {target}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_no_private_submodule_of_another_package(module, path):
    own = module.split(".")
    wrong = []
    for target, line in _imports(path):
        parts = target.split(".")
        for depth, name in enumerate(parts[1:], start=1):
            private = name.startswith("_") and not name.startswith("__")
            if private and parts[:depth] != own[:depth]:
                wrong.append(f"{path.name}:{line}: imports {target}")
                break
    assert not wrong, "\n".join(wrong)
