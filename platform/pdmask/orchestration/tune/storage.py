"""The sweep's state folder when the machine fails under it: say so, once, in pdm's words.

A full disk or a vanished state folder reaches Tune first: its syncer and experiment-state
writer log each failed write with a traceback, and its result grid then trips over the empty
error files it could not write (``EOFError``). Neither names the cause. So:

- ``check_writable`` is asked when Tune fails for a reason pdmask cannot name: a write into the
  state folder raises the machine's own ``OSError`` (ENOSPC, EROFS, ...), which the CLI reports as
  one line (``errors.environment_error``, exit 2);
- ``quiet_storage_logs`` keeps those Ray loggers to one line per failure (``PDM_DEBUG=1``: whole).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

# Ray's loggers that report failed writes into the storage path with a traceback in the message.
STORAGE_LOGGERS = ("ray.train._internal.syncer", "ray.tune.execution.experiment_state")
_PROBE_BYTES = 64 * 1024  # more than a full disk's last free block


def check_writable(folder: Path) -> None:
    """Raise the ``OSError`` of a write into ``folder`` (made if missing), naming the folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".pdm-write-check-", dir=folder)
        try:
            os.write(fd, b"\0" * _PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(name)
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(folder)) from err


class _FirstAndLastLine(logging.Filter):
    """A record whose message holds a traceback keeps its first line and the exception's."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "Traceback (most recent call last)" in text or record.exc_info:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            last = lines[-1] if len(lines) > 1 else ""
            if record.exc_info and record.exc_info[1] is not None:
                last = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
            record.msg, record.args = f"{lines[0] if lines else ''} {last}".strip(), ()
            record.exc_info = record.exc_text = None
        return True


def quiet_storage_logs() -> None:
    """One line per failed storage write from Ray's loggers, in this process (idempotent)."""
    if os.environ.get("PDM_DEBUG"):
        return
    for name in STORAGE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _FirstAndLastLine) for f in logger.filters):
            logger.addFilter(_FirstAndLastLine())
