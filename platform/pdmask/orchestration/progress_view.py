"""What the sweep's progress shows, computed from its rows: the header, the rows that fit, the ETA.

Pure (no Ray, no clock of its own): ``tune/progress.py`` feeds it Tune's events and the time, so the
tests render a 60-trial sweep on a fake clock. The header counts this invocation's trials:
done (finished, or found finished by another invocation meanwhile), running (training, waiting
for another sweep's claim, or retrying), failed (crashed out of retries, stalled, refused
configuration) and queued (not started yet). The table shows running trials first, then failed,
queued and done ones, as many as the terminal's height leaves room for, and one "N more ..."
line per kind that did not fit.
"""

from __future__ import annotations

import heapq
import re
import time
from dataclasses import dataclass, field
from statistics import mean

from rich.console import Group
from rich.text import Text

from pdmask.console import table

HEADLINE_LABEL = "avg@16"  # the headline metric's column (its name: the backend's eval_metrics)
SAMPLES = re.compile(r"mean_at_(\d+)$")  # verl's mean@N, as MLflow names it
RUNNING = ("running", "waiting", "retrying")
FAILED = ("failed", "config error", "recipe error")
DONE = ("done", "skipped", "elsewhere")
# Lines of the view besides its rows: the header; the table's title, the blank line under it,
# its column names and rule, its closing blank line; and one left free, so that the terminal
# does not scroll the live display's first line away.
FIXED_LINES = 7


def headline_label(metrics: list[str]) -> str:
    """``avg@N`` when every headline metric is a ``.../mean_at_N`` of one N (verl's names; the
    tiny CPU profile samples 2), else ``HEADLINE_LABEL``."""
    samples = {m.group(1) if (m := SAMPLES.search(name)) else None for name in metrics}
    if len(samples) == 1 and None not in samples:
        return f"avg@{samples.pop()}"
    return HEADLINE_LABEL


@dataclass
class Row:
    name: str
    trial_hash: str | None = None
    state: str = "pending"
    step: int = -1
    total: int = 0
    eval: float | None = None
    attempt: int = 1
    started: float = field(default_factory=time.monotonic)
    first_step_at: float | None = None
    first_step: int = 0
    finished_at: float | None = None
    outcome: str | None = None

    def seconds_per_step(self, now: float) -> float | None:
        if self.first_step_at is None or self.step <= self.first_step:
            return None
        return (now - self.first_step_at) / (self.step - self.first_step)

    def remaining(self, now: float) -> float | None:
        """Seconds this running trial still needs, at its rate so far (None until known)."""
        rate = self.seconds_per_step(now)
        if self.state != "running" or rate is None or not self.total:
            return None
        return rate * max(self.total - self.step, 0)

    def eta(self, now: float | None = None) -> str:
        left = self.remaining(time.monotonic() if now is None else now)
        return "" if left is None else duration(left)


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


def trial_seconds(rows: list[Row], now: float) -> float | None:
    """How long one trial takes, start-up included: the finished ones' mean, else the running
    ones' start-up plus their steps at their rate so far; None until a rate is known."""
    finished = [r.finished_at - r.started for r in rows if r.state == "done" and r.finished_at]
    if finished:
        return mean(finished)
    estimates = [
        (r.first_step_at - r.started) + rate * max(r.total - r.first_step, 0)
        for r in rows
        if r.state == "running" and r.total and (rate := r.seconds_per_step(now)) is not None
    ]
    return mean(estimates) if estimates else None


def sweep_eta(rows: list[Row], queued: int, now: float, slots: int) -> float | None:
    """Seconds until the last trial ends: each running trial's remaining time, then the queued
    ones placed one by one on the slot that frees first (``slots``: trials run side by side)."""
    per_trial = trial_seconds(rows, now)
    running = [r for r in rows if r.state in RUNNING]
    if per_trial is None:
        return None if running or queued else 0.0
    ends = []
    for r in running:
        left = r.remaining(now)
        ends.append(left if left is not None else max(per_trial - (now - r.started), 0.0))
    ends += [0.0] * max(slots - len(ends), 0)
    if not ends:
        ends = [0.0]
    heapq.heapify(ends)
    for _ in range(queued):
        heapq.heappush(ends, heapq.heappop(ends) + per_trial)
    return max(ends)


def header(sweep: str, rows: list[Row], total: int, elapsed: float, now: float, slots: int) -> str:
    """The sweep's counts, elapsed time and ETA on one line (also the heartbeat off a terminal)."""
    c = counts(rows, total)
    eta = sweep_eta(rows, c.queued, now, slots)
    return (
        f"{sweep}: {c.done}/{c.total} done, {c.running} running, {c.failed} failed, "
        f"{c.queued} queued; elapsed {duration(elapsed)}, "
        f"ETA {'—' if eta is None else duration(eta)}"
    )


def visible(
    rows: list[Row], queued_names: list[str], room: int, unnamed_queued: int = 0
) -> tuple[list[Row], list[str]]:
    """The rows that fit in ``room`` lines, running ones first, and a "N more ..." line for each
    kind cut; ``queued_names``: trials not started yet (shown as queued rows); ``unnamed_queued``:
    more of them, whose names are not known yet (a search's points), counted in a "more" line."""
    queued = [r for r in rows if r.state == "pending"]
    queued += [Row(name=n, state="queued") for n in queued_names]
    kinds = [
        ("running", [r for r in rows if r.state in RUNNING], 0),
        ("failed", [r for r in rows if r.state in FAILED], 0),
        ("queued", queued, unnamed_queued),
        ("done", [r for r in rows if r.state in DONE], 0),
    ]
    needed = sum(len(members) for _, members, _ in kinds)
    for more_lines in range(len(kinds) + 1):
        cap = max(min(needed, room - more_lines), 0)
        shown, more = [], []
        for kind, members, unnamed in kinds:
            take = members[: max(cap - len(shown), 0)]
            shown += take
            if len(take) < len(members) or unnamed:
                more.append(f"… {len(members) - len(take) + unnamed} more {kind}")
        if len(more) <= more_lines:
            break
    return shown, more


def view(sweep: str, rows: list[Row], queued_names: list[str], *, total: int, elapsed: float,
         now: float, slots: int, height: int) -> Group:  # fmt: skip
    """The header above a table of the rows that fit in ``height`` lines."""
    pending = sum(r.state == "pending" for r in rows)
    queued = max(counts(rows, total).queued - pending, 0)  # not started, not even by Tune
    named = queued_names[:queued]
    shown, more = visible(rows, named, max(height - FIXED_LINES, 1), queued - len(named))
    body = [
        [
            r.name,
            r.state,
            f"{max(r.step, 0)}/{r.total}" if r.total else ("" if r.step < 0 else r.step),
            "" if r.eval is None else f"{r.eval:.3f}",
            r.eta(now),
        ]
        for r in shown
    ]
    body += [[line, "", "", "", ""] for line in more]
    trials = table("trials", ["trial", "state", "step", HEADLINE_LABEL, "ETA"], body)
    return Group(Text(header(sweep, rows, total, elapsed, now, slots), style="bold"), trials)
