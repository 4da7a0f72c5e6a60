"""Every exception pdmask raises on purpose, in one place.

    PdmError                      base class; ``exit_code`` is what the CLI exits with
    ├── ConfigError               bad user input (recipes, sweeps, flags); exit 2; never retried
    │   ├── ValidationFailed      many problems found at once (``.problems``), each naming file+field
    │   └── RecipeError           a recipe's own code failed or broke its contract (``.problem``:
    │                             its file, hook and line); at training time too, never retried
    ├── TrackingError             the MLflow store cannot be read or is incompatible; exit 2
    ├── BackendUnavailable        a backend's optional dependencies are missing; exit 2
    ├── ClusterLost               the sweep's Ray cluster lost its nodes mid-sweep, or its job
    │                             API stopped answering for longer than the bound; exit 1;
    │                             resumable by running the same command again
    ├── StoreLost                 a trial could not record its own failure (its store cannot be
    │                             written: disk full, state folder gone); exit 2, not retried
    └── TrialFailed               a trial crashed (killed, OOM, NaN loss); retried by the sweep runner

Code that catches ``Exception`` to keep a sweep alive must re-raise ``ConfigError``: configuration
errors fail fast and are never retried.

What a caller must catch is in each public entry point's ``Raises:`` section, naming classes of
this tree only (``pdmask.run_sweep``, ``pdmask.runs``, ``api.plan``, ``Registry.sweep`` and
``expand``, ``load_backend``, ``open_client``, ``build_figure``, ``run_token_analysis``,
``validate_sweeps``, the runner's ``run_sweep``; ``tests/test_entry_point_errors.py`` holds it).

The machine's own failures (a full disk, a read-only or vanished state folder, a permission) reach
the CLI as ``OSError``, or as a store error whose cause is sqlite's (``sqlite3.OperationalError``:
"database or disk is full", "attempt to write a readonly database" once its file is deleted);
``environment_error`` turns them into one line (exit 2, before or during a sweep: what finished
is kept and the same command resumes), and ``PDM_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


class PdmError(Exception):
    """Base class of every deliberate pdmask error."""

    exit_code = 1


class ConfigError(PdmError):
    """Bad user input: a recipe, sweep, dashboard or command-line value. Never retried."""

    exit_code = 2


def known_names(value: object, known) -> str:
    """What follows an unknown name in a message: the closest known names first ("did you
    mean"), then every known one, so a typo is fixed without reading the whole list."""
    import difflib

    names = sorted(str(k) for k in known)
    close = difflib.get_close_matches(str(value), names, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    return f"{hint}known: {', '.join(names) or '(none)'}"


@dataclass(frozen=True)
class Problem:
    """One validation problem: where it is and what is wrong."""

    file: str
    field: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}"


def validation_problems(
    err: ValidationError,
    file: str,
    *,
    line_of: Callable[[tuple[Any, ...]], int | None] | None = None,
    field_of: Callable[[tuple[Any, ...]], str] | None = None,
    whole: str = "(top level)",
) -> list[Problem]:
    """Every error of a pydantic ``ValidationError`` as a Problem naming ``file``: the field is
    the error's dotted location (``field_of`` renames it, e.g. as a command-line flag; ``whole``
    when it concerns the whole object), the line ``line_of(location)`` where a source is known."""
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        field = field_of(loc) if field_of else ".".join(str(part) for part in loc) or whole
        message = e["msg"].removeprefix(
            "Value error, "
        )  # pydantic's prefix for a raised ValueError
        problems.append(Problem(file, field, message, line_of(loc) if line_of else None))
    return problems


class ValidationFailed(ConfigError):
    """Several problems found at once; the message lists them all."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        lines = [f"{len(self.problems)} problem(s) found, nothing was launched:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class RecipeError(ConfigError):
    """A recipe's mask or loss raised, or returned what the recipe contract does not allow.

    A bug in the recipe's file, not a crash of the trial: retrying would fail the same way.
    """

    def __init__(self, problem: Problem):
        self.problem = problem
        super().__init__(f"recipe {problem}")


class TrackingError(PdmError):
    """The tracking store (MLflow) is unreadable, unreachable or incompatible."""

    exit_code = 2


class BackendUnavailable(PdmError):
    """A backend's optional dependencies are not installed (e.g. the ``verl`` extra)."""

    exit_code = 2


class ClusterLost(PdmError):
    """The Ray cluster a sweep runs on has no live node (or no CPU) left, or its job API has not
    answered for ``PDM_CLUSTER_UNREACHABLE_SECONDS``: nothing can train, or nothing can be seen."""

    exit_code = 1


class StoreLost(PdmError):
    """A trial failed and its store could not take the reason either: the machine's fault
    (``environment_error``'s line). Retrying would fail the same way, so the sweep ends."""

    exit_code = 2


class TrialFailed(PdmError):
    """A trial crashed (killed, out of memory, NaN loss). The sweep runner retries it."""

    exit_code = 1


class IncompleteRun(TrialFailed):
    """A trial's training ended, but its run lacks planned steps or validations
    (``tracking/completeness.py``): never FINISHED; retried, resuming from its checkpoint."""


# What to do about each failure of the machine a command runs on (see the module docstring).
_ENVIRONMENT_HINTS = {
    errno.ENOSPC: "the disk is full: free space (or point PDM_HOME at another disk)",
    errno.EDQUOT: "the disk quota is used up: free space (or point PDM_HOME at another disk)",
    errno.EROFS: "the file system is read-only: point PDM_HOME at a writable folder",
    errno.EACCES: "permission denied: point PDM_HOME at a folder you can write",
    errno.EPERM: "not permitted: point PDM_HOME at a folder you can write",
    errno.ENOENT: "a folder it needs is gone (deleted while it ran?)",
    errno.ENOTDIR: "a path it needs runs through a file, not a folder: check PDM_HOME",
}


# sqlite's words for the same failures (it reports them as messages, not errno values).
_SQLITE_HINTS = {
    "database or disk is full": _ENVIRONMENT_HINTS[errno.ENOSPC],
    "attempt to write a readonly database": (
        "the store's file or the state folder was deleted or made read-only while pdm ran: "
        "restore it or point PDM_HOME at a writable folder"
    ),
    "unable to open database file": "the state folder is gone or cannot be written: check PDM_HOME",
    "disk i/o error": "the disk failed a read or write (full, removed or read-only?)",
}


def _chain(err: BaseException):
    """``err`` and the exceptions it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def environment_error(err: BaseException) -> str | None:
    """One line for a failure caused by the machine rather than by pdmask (None otherwise):
    an ``OSError`` of a known kind, or a store error caused by sqlite's own report of one."""
    for link in _chain(err):
        if isinstance(link, OSError) and link.errno in _ENVIRONMENT_HINTS:
            where = f" ({link.filename})" if link.filename else ""
            return _line(f"{link.strerror or link}{where}", _ENVIRONMENT_HINTS[link.errno])
        if isinstance(link, sqlite3.OperationalError):
            text = str(link).lower()
            hint = next((h for words, h in _SQLITE_HINTS.items() if words in text), None)
            if hint is not None:
                return _line(f"the tracking store cannot be written (sqlite: {link})", hint)
    return None


def _line(what: str, hint: str) -> str:
    return f"{what}: {hint}; what finished is kept: run the same command again"
