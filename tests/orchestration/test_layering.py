"""Orchestration knows backends only through their interface: a new backend is one module.

Every import in ``pdmask/orchestration`` (at module level or inside a function) is read from the
source; one of ``pdmask.backends`` other than ``pdmask.backends.interface`` fails, naming file and
line. Pure: nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pdmask.orchestration

ORCHESTRATION = Path(pdmask.orchestration.__file__).parent
ALLOWED = "pdmask.backends.interface"


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "pdmask" and any(a.name == "backends" for a in node.names):
                yield node.lineno, "pdmask.backends"
            else:
                yield node.lineno, node.module


def test_orchestration_imports_nothing_of_backends_but_their_interface():
    files = sorted(ORCHESTRATION.rglob("*.py"))
    assert len(files) > 10  # the package was found
    wrong = [
        f"{path.relative_to(ORCHESTRATION)}:{line}: imports {module}"
        for path in files
        for line, module in _imports(path)
        if (module == "pdmask.backends" or module.startswith("pdmask.backends."))
        and module != ALLOWED
    ]
    assert wrong == [], "\n".join(wrong)


def test_the_scan_sees_imports_inside_functions(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from pdmask.backends.verl.jobs import on_cpu\n")
    assert (2, "pdmask.backends.verl.jobs") in list(_imports(probe))


RUNNER = "pdmask.orchestration.runner"
KINDS = ("tune", "jobs")  # a folder per launch kind


def test_a_launch_kind_imports_neither_the_other_kind_nor_the_runner():
    wrong = []
    for kind in KINDS:
        forbidden = [f"pdmask.orchestration.{k}" for k in KINDS if k != kind] + [RUNNER]
        for path in sorted((ORCHESTRATION / kind).rglob("*.py")):
            wrong += [
                f"{path.relative_to(ORCHESTRATION)}:{line}: imports {module}"
                for line, module in _imports(path)
                if any(module == f or module.startswith(f"{f}.") for f in forbidden)
            ]
    assert wrong == [], "\n".join(wrong)


def _imports_runner(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        if RUNNER in names:
            return True
    return False


def test_only_the_library_entry_point_imports_the_runner():
    package = ORCHESTRATION.parent
    importers = {str(p.relative_to(package)) for p in package.rglob("*.py") if _imports_runner(p)}
    assert importers == {"api.py"}
