"""Names given on the command line (a sweep, a run, a figure) are names, never paths.

A command matches each such argument against the names pdmask knows (``known``) or a strict
pattern before it builds any path from it, so ``../..``, a glob or an absolute path never reaches
the file system: it exits 2 with a problem naming the argument and the known names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# What a sweep is called where no list of known names can say it (an MLflow experiment that the
# project's sweeps/ does not hold): a file stem's characters, never a separator, glob or leading dot.
SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]*")
# A prefix of a trial hash (sha256 hex), long enough not to match by accident.
HASH_PREFIX = re.compile(r"[0-9a-f]{4,64}")
_PATH_LIKE = re.compile(r"[/\\*?\[\]{}~]|^\.{1,2}$|^$")


def checked(
    value: str,
    *,
    argument: str,
    kind: str,
    known: Iterable[str],
    pattern: re.Pattern[str] | None = None,
    listed: Iterable[str] | None = None,
) -> str:
    """``value`` when it is one of ``known`` or fully matches ``pattern`` (and is no path).

    ``listed``: the names the problem offers (default ``known``), for arguments where more
    spellings are accepted than are worth listing (a log's file stem beside its run name).

    Raises:
        ValidationFailed: one problem naming ``argument``, what is wrong and the known names.
    """
    from pdmask.errors import Problem, ValidationFailed, known_names

    names = sorted(set(known))
    path_like = bool(_PATH_LIKE.search(value)) or ".." in value
    if not path_like and (value in names or (pattern and pattern.fullmatch(value))):
        return value
    why = "is a path or a pattern, not a name" if path_like else f"names no {kind}"
    offered = names if listed is None else sorted(set(listed))
    problem = Problem("command line", argument, f"{value!r} {why}; {known_names(value, offered)}")
    raise ValidationFailed([problem])
