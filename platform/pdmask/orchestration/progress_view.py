"""What the sweep's progress shows, computed from its rows: the header, the rows that fit, the ETA.

Pure (no Ray, no clock of its own): ``tune/progress.py`` feeds it Tune's events, the time and the
ETA (``eta.py``, the rule both launch kinds use), so the tests render a 60-trial sweep on a fake
clock. The header counts this invocation's trials:
done (finished, or found finished by another invocation meanwhile), running (training, waiting
for another sweep's claim, or retrying), failed (crashed out of retries, stalled, refused
configuration) and queued (not started yet). The table shows running trials first (with the
time each has left), then failed ones, then the latest finished (headline metric and time
taken), as many as the terminal's height leaves room for, one "… N more" line per kind that
did not fit, and the queued trials as one line, "queued: 33".
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group
from rich.text import Text

from pdmask.console import table
from pdmask.orchestration.eta import DONE, FAILED, RUNNING, Row

# the headline's column name; headline_label is report.py's too (its home: metric_names)
from pdmask.tracking.metric_names import HEADLINE_LABEL, headline_label  # noqa: F401

HEARTBEAT_S = 45.0  # off a terminal (and on the job loop), a line with the counts this often
# Lines of the view besides its rows: the header; the table's title, the blank line under it,
# its column names and rule, its closing blank line; and one left free, so that the terminal
# does not scroll the live display's first line away.
FIXED_LINES = 7


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: short, and the same width for the same order of time."""
    s = int(round(max(seconds, 0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s // 60 % 60:02d}m"


@dataclass(frozen=True)
class Counts:
    done: int
    running: int
    failed: int
    queued: int
    total: int


def counts(rows: list[Row], total: int) -> Counts:
    done = sum(r.state in DONE for r in rows)
    running = sum(r.state in RUNNING for r in rows)
    failed = sum(r.state in FAILED for r in rows)
    return Counts(done, running, failed, max(total - done - running - failed, 0), total)


def header(sweep: str, rows: list[Row], total: int, elapsed: float, eta: float | None) -> str:
    """The sweep's counts, elapsed time and ETA (``eta.sweep_eta``) on one line (also the
    heartbeat off a terminal, and the job loop's progress line)."""
    c = counts(rows, total)
    return (
        f"{sweep}: {c.done}/{c.total} done, {c.running} running, {c.failed} failed, "
        f"{c.queued} queued; elapsed {duration(elapsed)}, "
        f"ETA {'—' if eta is None else duration(eta)}"
    )


def latest_done(rows: list[Row]) -> list[Row]:
    """The finished trials, the latest first (those finished before this invocation last)."""
    done = [r for r in rows if r.state in DONE]
    return sorted(done, key=lambda r: -(r.finished_at or float("-inf")))


def visible(rows: list[Row], queued: int, room: int) -> tuple[list[Row], list[str]]:
    """The rows that fit in ``room`` lines: running ones first, then failed ones, then the
    latest finished; then a "… N more" line for each kind cut, and the ``queued`` trials (not
    started yet) as one "queued: N" line."""
    kinds = [
        ("running", [r for r in rows if r.state in RUNNING]),
        ("failed", [r for r in rows if r.state in FAILED]),
        ("done", latest_done(rows)),
    ]
    queued_line = [f"queued: {queued}"] if queued else []
    room -= len(queued_line)
    needed = sum(len(members) for _, members in kinds)
    for more_lines in range(len(kinds) + 1):
        cap = max(min(needed, room - more_lines), 0)
        shown, more = [], []
        for kind, members in kinds:
            take = members[: max(cap - len(shown), 0)]
            shown += take
            if len(take) < len(members):
                more.append(f"… {len(members) - len(take)} more {kind}")
        if len(more) <= more_lines:
            break
    return shown, more + queued_line


def _time(row: Row, now: float) -> str:
    """A running trial's time left (at its rate so far), a finished one's time taken."""
    if row.state in DONE:  # skipped / elsewhere: finished by another invocation, not timed here
        timed = row.state == "done" and row.finished_at is not None
        return duration(row.finished_at - row.started) if timed else ""
    left = row.remaining(now)
    return "" if left is None else f"{duration(left)} left"


def view(sweep: str, rows: list[Row], *, total: int, elapsed: float, now: float,
         eta: float | None, height: int) -> Group:  # fmt: skip
    """The header above a table of the rows that fit in ``height`` lines."""
    queued = counts(rows, total).queued  # not started (Tune's pending trials among them)
    shown, notes = visible(rows, queued, max(height - FIXED_LINES, 1))
    body = [
        [
            r.name,
            r.state,
            f"{max(r.step, 0)}/{r.total}" if r.total else ("" if r.step < 0 else r.step),
            "" if r.eval is None else f"{r.eval:.3f}",
            _time(r, now),
        ]
        for r in shown
    ]
    body += [[line, "", "", "", ""] for line in notes]
    trials = table("trials", ["trial", "state", "step", HEADLINE_LABEL, "time"], body)
    return Group(Text(header(sweep, rows, total, elapsed, eta), style="bold"), trials)
