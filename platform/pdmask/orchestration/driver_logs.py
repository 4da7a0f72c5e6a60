"""The libraries' log lines of a sweep's driver go to ``<logs>/<sweep>/driver.log``, not its console.

MLflow (and the alembic and SQLAlchemy layers under its store), Optuna and Ray/Tune each give
their root logger a handler to stderr at import; their INFO lines ("Started a local Ray
instance", Optuna's "A new study created", store migrations) would break into the progress
display. While a sweep runs those handlers are swapped for one file in the sweep's logs folder
(``paths.logs_dir()``; the trials' own logs sit next to it as ``<run name>.<hash>.log``), and put back
after. ``PDM_DEBUG=1`` keeps them on the console as well.

Ray's driver also prints what its GCS publishes as errors, whatever ``log_to_driver`` says: the
raylet's "A worker died or was killed while executing a task ..." of a trial's death comes out as
``(raylet) ...`` in colour codes. While routed, those lines go to the driver log too, without the
codes: the trial's own event line names the death with its cause (``tune/deaths.py``). What Ray
prints beyond them carries no colour codes off a terminal (``RAY_COLOR_PREFIX=0``).

Writing the file can fail (a full disk, a state folder deleted mid-sweep): such a record is
dropped, never reported with a traceback on the console, which says the cause once itself.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The libraries' loggers that carry their own console handler (the children propagate to them).
NOISY_LOGGERS = (
    "mlflow",
    "alembic",
    "sqlalchemy",
    "sqlalchemy.engine",
    "huey",
    "optuna",
    "ray",
    "ray.data",
)
DRIVER_LOG = "driver.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Ray's printer of what reaches its driver (its error-message listener calls it by this name).
RAY_WORKER, RAY_PRINTER = "ray._private.worker", "print_to_stdstream"
RAYLET = "raylet"  # the "pid" Ray gives the GCS's error messages
ANSI_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _QuietFileHandler(logging.FileHandler):
    """A file handler that drops what it cannot write instead of printing a traceback."""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError):  # with ``delay``, the file opens outside logging's
            super().emit(record)  # own error handling

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        pass

    def close(self) -> None:
        # closing flushes: on a full disk that fails, and must not hide the sweep's own error
        with contextlib.suppress(OSError):
            super().close()


def driver_log(sweep: str) -> Path:
    from pdmask.paths import logs_dir

    return logs_dir() / sweep / DRIVER_LOG


def _ray_lines(ray_printer, data: dict, ignore_prefix: bool) -> None:
    """Ray's ``print_to_stdstream`` while routed: the raylet's error messages to the driver log
    (``ray``'s logger) without colour codes, anything else printed by Ray as before."""
    if data.get("pid") != RAYLET:
        return ray_printer(data, ignore_prefix)
    for line in data.get("lines", []):
        logging.getLogger("ray").warning("(raylet) %s", ANSI_CODES.sub("", line))


class _Routing:
    def __init__(self, path: Path | None, handler: logging.Handler):
        self.path, self.handler = path, handler
        self.saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate)
                      for n in NOISY_LOGGERS}  # fmt: skip
        self.ray_printer = None  # Ray's own, once replaced
        self.color = os.environ.get("RAY_COLOR_PREFIX")
        if not sys.stdout.isatty():  # read by Ray's printer at each line
            os.environ["RAY_COLOR_PREFIX"] = "0"

    def apply(self) -> None:
        keep_console = bool(os.environ.get("PDM_DEBUG"))
        for name in NOISY_LOGGERS:
            logger = logging.getLogger(name)
            kept = [h for h in logger.handlers if keep_console and h is not self.handler]
            logger.handlers, logger.propagate = [*kept, self.handler], False
        worker = sys.modules.get(RAY_WORKER)  # Ray imported meanwhile
        if worker is not None and self.ray_printer is None and not keep_console:
            self.ray_printer = getattr(worker, RAY_PRINTER)
            setattr(worker, RAY_PRINTER, functools.partial(_ray_lines, self.ray_printer))

    def undo(self) -> None:
        for name, (handlers, propagate) in self.saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
        if self.ray_printer is not None:
            setattr(sys.modules[RAY_WORKER], RAY_PRINTER, self.ray_printer)
        if self.color is None:
            os.environ.pop("RAY_COLOR_PREFIX", None)
        else:
            os.environ["RAY_COLOR_PREFIX"] = self.color
        self.handler.close()


_active: list[_Routing] = []  # the routing of the sweep running in this process


def reroute() -> None:
    """Route again the loggers a library imported meanwhile gave a console handler (importing
    Ray or Optuna configures theirs)."""
    if _active:
        _active[0].apply()


@contextmanager
def routed(sweep: str) -> Iterator[Path | None]:
    """While inside: the noisy loggers write to the sweep's driver log (its path; None when it
    cannot be made, and the lines are dropped). A nested call routes again, in the outer file."""
    if _active:
        _active[0].apply()
        yield _active[0].path
        return
    path: Path | None = None
    try:
        path = driver_log(sweep)
        path.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = _QuietFileHandler(path, delay=True)
    except OSError:  # an unusable state folder: reported by what needs it, not here
        path, handler = None, logging.NullHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    routing = _Routing(path, handler)
    routing.apply()
    _active.append(routing)
    try:
        yield path
    finally:
        _active.clear()
        routing.undo()
