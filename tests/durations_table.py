"""Per-folder test counts and seconds from a pytest JUnit XML file: tests/README.md's table.

    python -m pytest -q -n 2 --junitxml=junit.xml
    python tests/durations_table.py junit.xml

Seconds are the sum of the folder's test durations (setup, call and teardown: module fixtures
such as a shared sweep are charged to the test that first needs them), so with two workers the
sum over folders is about twice the wall time.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def folder_of(classname: str) -> str:
    """``tests.cli.test_ui`` -> ``cli``; a test module at the top of ``tests`` -> ``(top)``."""
    parts = classname.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "(top)"


def main(path: str) -> int:
    counts: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        folder = folder_of(case.get("classname", ""))
        counts[folder] += 1
        seconds[folder] += float(case.get("time", 0))
    print("| folder | tests | seconds |\n|---|---:|---:|")
    for folder in sorted(seconds, key=seconds.get, reverse=True):
        print(f"| `{folder}` | {counts[folder]} | {seconds[folder]:.0f} |")
    print(f"| all | {sum(counts.values())} | {sum(seconds.values()):.0f} |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
