"""Light imports (no torch for the quick commands), and the names and schemas kept in sync."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_registry_names_are_the_math_apis_tests():
    from pdmask.registry.math_names import DIRECTION_NAMES, PROXIMITY_NAMES
    from pdmask.trust_region import DIRECTION_TESTS, PROXIMITY_TESTS

    assert set(PROXIMITY_NAMES) == set(PROXIMITY_TESTS)
    assert set(DIRECTION_NAMES) == set(DIRECTION_TESTS)


def test_listing_recipes_and_expanding_a_sweep_never_import_torch():
    code = (
        "import sys\n"
        "from pdmask.cli import main\n"
        "from pdmask.registry import load_registry\n"
        f"reg = load_registry({str(ROOT)!r})\n"
        "assert len(reg.expand('main-figure')) == 72\n"
        "assert not reg.problems, reg.problems\n"
        "try:\n"
        "    main(['recipes', 'list'])\n"
        "except SystemExit as exit:\n"
        "    assert not exit.code, exit.code\n"
        "print('TORCH', 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TORCH False" in done.stdout, done.stdout[-2000:]
