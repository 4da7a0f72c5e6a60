"""Download the wheels the GPU check needs and the lent GPU machine lacks (run here, not there).

    python benchmarks/gpu/prepare.py                          # cp312 wheels into .whl/ (the device)
    python benchmarks/gpu/prepare.py --python-version 3.11 --dest /tmp/whl311   # to test here

The lent GPU machine has its own Python 3.12 with torch and transformers but no package index and
no internet, and at most 64 MiB travels there (the git working tree plus carried ignored folders).
So the packages that ``benchmarks/gpu_check.py`` imports and the machine lacks (verl, tensordict,
pydantic, ...; pinned in ``benchmarks/gpu/wheels.txt``) travel as wheels, and ray, whose wheel is
far too big, is replaced there by a stand-in (``benchmarks/gpu/standins``).

For each ``name==version`` in wheels.txt this asks pip (of the Python running this script) for a
binary wheel for the target Python on manylinux x86_64, without dependencies (wheels.txt is the
whole closure). A package published only as an sdist (antlr4-python3-runtime 4.9.3) is built into
a wheel here, which must then be pure Python (``none-any``) to run on the target. The destination is
cleared of old wheels first, and two versions of one package there are an error. Finally it prints
each wheel's size, their total, and what would travel (tracked and untracked non-ignored files of
the working tree plus the wheels) against the 64 MiB limit, exiting 1 if over.

On the device (as ``benchmarks/gpu/import_check.py`` describes)::

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:platform python3 benchmarks/gpu/import_check.py

Standard library only.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEELS_TXT = Path(__file__).resolve().parent / "wheels.txt"
LIMIT = 64 * 2**20
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> list[str]:
    """The ``name==version`` lines of wheels.txt (comments and blank lines skipped)."""
    pins = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+", line):
            sys.exit(f"{path}: not a name==version pin: {raw!r}")
        pins.append(line)
    names = [canonical(pin.split("==")[0]) for pin in pins]
    if len(set(names)) < len(names):
        sys.exit(
            f"{path}: a package pinned twice: {sorted({n for n in names if names.count(n) > 1})}"
        )
    return pins


def wheel_name(path: Path) -> str:
    """The canonical distribution name of a wheel file (its first dash-separated field)."""
    return canonical(path.name.split("-", 1)[0])


def pip(*args: str) -> tuple[bool, str]:
    """Run this Python's pip quietly: did it succeed, and the end of what it said."""
    cmd = [sys.executable, "-m", "pip", "-q", *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    return result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def fetch(pin: str, dest: Path, python_version: str) -> None:
    """Put ``pin``'s wheel for the target into ``dest``: a binary wheel, else one built here."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    target = ["--python-version", python_version, "--implementation", "cp", *platforms]
    binary = ["download", "--no-deps", "--only-binary=:all:", *target, "-d", str(dest), pin]
    ok, said = pip(*binary)
    if ok:
        return
    print(f"  {pin}: no wheel for the target; building one here from its sdist")
    before = set(dest.glob("*.whl"))
    name = pin.split("==")[0]
    built_ok, built_said = pip("wheel", "--no-deps", f"--no-binary={name}", "-w", str(dest), pin)
    if not built_ok:
        print(said, built_said, sep="\n", file=sys.stderr)
        sys.exit(f"{pin}: neither a wheel for Python {python_version} nor a build from its sdist")
    for built in set(dest.glob("*.whl")) - before:
        if not built.name.endswith("-none-any.whl"):
            sys.exit(f"{built.name}: built here but not pure Python; it would not run there")


def travel_bytes(wheels: Path) -> int:
    """What the device tool copies: tracked and untracked non-ignored files, plus the wheels."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    total = 0
    for name in set(listed.decode().split("\0")) - {""}:
        path = REPO / name
        if path.is_file() and not path.is_relative_to(wheels):
            total += path.lstat().st_size
    return total + sum(p.stat().st_size for p in wheels.glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python-version", default="3.12", help="target Python (device: 3.12)")
    parser.add_argument("--dest", type=Path, default=REPO / ".whl", help="wheel folder")
    parser.add_argument("--wheels", type=Path, default=WHEELS_TXT, help="the pinned list")
    args = parser.parse_args(argv)

    pins = read_pins(args.wheels)
    dest = args.dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.glob("*.whl"):
        stale.unlink()
    for pin in pins:
        print(f"{pin} ...", flush=True)
        fetch(pin, dest, args.python_version)

    wheels = sorted(dest.glob("*.whl"))
    names = [wheel_name(w) for w in wheels]
    doubles = sorted({n for n in names if names.count(n) > 1})
    missing = sorted({canonical(p.split("==")[0]) for p in pins} - set(names))
    if doubles or missing:
        sys.exit(f"{dest}: two versions of {doubles or '-'}; no wheel for {missing or '-'}")

    print(f"\nwheels for Python {args.python_version} in {dest}:")
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:9.2f} MiB  {w.name}")
    total = sum(w.stat().st_size for w in wheels)
    print(f"{total / 2**20:9.2f} MiB  total, {len(wheels)} wheels")
    travel = travel_bytes(dest)
    over = travel > LIMIT
    print(
        f"{travel / 2**20:9.2f} MiB  would travel (working tree + wheels) of "
        f"{LIMIT / 2**20:.0f} MiB: {'OVER THE LIMIT' if over else 'fits'}"
    )
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
