"""Dashboard: a live view of a workspace while its machines run, in the notebook or as a page.

It reads what is on disk once (`load_runs`, machine definitions, training log dirs), then follows
the files machines write (`store/follow.py`: `.machine/events.jsonl` from where it was read, run
files as they are renamed into place, each training run's `metrics.jsonl`) and keeps, per
machine, its live version, runs running now / finished today / failed, recent scores and what its
runs cost so far. `DashboardState` holds all of it and draws one HTML view; the `Dashboard`
widget shows that view (a click on a run opens it in an `ExamplePreviewer`) and hands new runs to
a RunPicker of the same workspace (`follow`); `machine-nb dashboard` serves the same HTML as a
page (`cli/dashboard.py`).

Following runs in a background thread that only reads and parses; what it found is applied to the
view on the kernel's event loop, between the messages the kernel answers, so a click is never
raced by an update and a burst of files is applied as one batch (coalesced), not once per file.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as _dt
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as w
import traitlets

from ..core.redact import redacted, scrub, secret_values
from ..store.workspace import event_fields
from ..core.theme import BG_ALT, BLUE, BORDER, FG, FG_MUTED, GREEN, ORANGE, RED, escape, no_math, text_colour
from ._base import StaticFallback

# How often the files are checked, in seconds (an idle check is one stat per followed file/folder).
INTERVAL_S = 0.5
# A RunPicker gets new runs at most this often (adding runs rebuilds its filter arrays, in a
# worker thread: see Dashboard._feed_pickers).
PICKER_INTERVAL_S = 0.5
# Events kept for the stream shown (the counts cover every event read).
EVENTS_SHOWN = 40
# Characters of an event's raw line shown, and of its start redacted before the cut (a secret
# running through the cut is redacted whole; scrubbing a 64 MiB line on every redraw is not done).
RAW_SHOWN = 300
REDACT_CHARS = 16384
# Runs listed as "latest runs" (newest first, each opens in the previewer).
RUNS_SHOWN = 15
# Scores in each machine's sparkline (the most recently finished runs).
SCORES_SHOWN = 30
# Loss points kept per training run for its curve (older points are thinned, not dropped: see _Job).
LOSS_POINTS = 400
# Event types that mean a run ended badly (counted as failed); others ending a run finish it.
FAILED_TYPES = ("run.failed", "run.error", "run.crashed")
FINISHED_TYPES = ("run.finished", "run.done", "run.completed")
STARTED_TYPES = ("run.started", "run.start")


# ---------------------------------------------------------------- plain helpers

def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float's range
        return None
    return None if math.isnan(f) else f


def _loss(v: int | float) -> float:
    """A loss as a float; an int past float's range is infinite (the curve leaves it out)."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _day_numbers(times: Any) -> list[int]:
    """UTC day numbers (days since 1970-01-01) of a datetime column (NaT rows: any number)."""
    import numpy as np
    import pandas as pd

    t = pd.to_datetime(times, utc=True)
    ns = t.dt.tz_convert(None).to_numpy(dtype="datetime64[ns]")
    return ns.astype("datetime64[D]").astype(np.int64).tolist()


def _event_day(when: Any) -> int | None:
    """The UTC day number of an event's ISO time (an offset is applied; no offset: UTC), or None."""
    if not isinstance(when, str):
        return None
    try:
        t = _dt.datetime.fromisoformat(when.strip())
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return int(t.timestamp() // 86400)


def _since(days: collections.Counter, today: int) -> int:
    """How many were counted on `today` or later (a writer's clock a little ahead counts as today)."""
    return sum(n for d, n in days.items() if d >= today)


def _shown_event(e: dict, secrets: list[str]) -> dict:
    """An event entry's texts as the view shows them: redacted (core/redact.py: the environment's
    secrets, key-shaped strings, URL passwords), the raw line cut to RAW_SHOWN characters after
    its first REDACT_CHARS are redacted, so a secret the cut runs through is not shown in part."""
    def clean(v: Any) -> Any:
        return None if v is None else scrub(str(v), secrets)[0]

    raw = e.get("raw")
    return {"type": clean(e.get("type")), "machine": clean(e.get("machine")), "run": clean(e.get("run")),
            "time": clean(e.get("time")), "error": clean(e.get("error")),
            "raw": None if raw is None else scrub(raw[:REDACT_CHARS], secrets)[0][:RAW_SHOWN]}


def _usd(v: float) -> str:
    return f"${v:,.4f}" if 0 < abs(v) < 0.01 else f"${v:,.2f}"


def sparkline(values: list[float], width: int = 120, height: int = 24, lo: float | None = None,
              hi: float | None = None, colour: str = BLUE) -> str:
    """A small inline SVG line of some values (theme colours; reads without a kernel).

    Args:
        values: the points, oldest first (None, NaN and infinities are left out: a loss that
            diverged would otherwise stretch the scale to infinity and blank the whole line).
        width, height: the size in px.
        lo, hi: the value range drawn (default None: the values' own).
        colour: the line colour.

    Returns:
        The `<svg>` markup ("" for fewer than one finite value).
    """
    pts = [v for v in values if v is not None and math.isfinite(v)]
    if not pts:
        return ""
    lo = min(pts) if lo is None else lo
    hi = max(pts) if hi is None else hi
    span = (hi - lo) or 1.0
    n = len(pts)
    xy = [(2 + (width - 4) * (i / (n - 1) if n > 1 else 0.5), 2 + (height - 4) * (1 - (v - lo) / span))
          for i, v in enumerate(pts)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dot = f'<circle cx="{xy[-1][0]:.1f}" cy="{xy[-1][1]:.1f}" r="2" fill="{colour}"/>'
    return (f'<svg class="mnb-spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'role="img"><polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>{dot}</svg>')


@dataclass
class _Machine:
    """What the dashboard knows of one machine (every count over the runs and events read)."""

    name: str
    live_version: str | None = None
    runs: int = 0
    finished_days: collections.Counter = field(default_factory=collections.Counter)  # UTC day number -> runs
    running: set = field(default_factory=set)        # run ids: started, not finished
    unfinished_files: set = field(default_factory=set)  # run ids whose file has no finishedAt
    failed: int = 0                                   # failure events
    failed_days: collections.Counter = field(default_factory=collections.Counter)  # UTC day number -> failures
    scores: collections.deque = field(default_factory=lambda: collections.deque(maxlen=SCORES_SHOWN))
    reported_usd: float = 0.0                         # usage.costUsd the harness recorded
    priced_usd: float = 0.0                           # tokens x price where no cost was recorded
    unpriced: int = 0                                 # runs with tokens but no known price
    sources: set = field(default_factory=set)
    versions_sig: tuple | None = None


@dataclass
class _Job:
    """A training run followed from its log dir."""

    name: str
    path: str
    tail: Any
    points: list = field(default_factory=list)   # (step, loss)
    steps: int = 0
    total: int | None = None
    first_seen: float | None = None               # (time, steps) when steps were first seen growing
    first_steps: int = 0
    last_time: float | None = None
    done: bool = False
    ckpt_sig: tuple | None = None
    metric: str | None = None

    def eta_s(self) -> float | None:
        if self.done or self.total is None or self.first_seen is None or self.last_time is None:
            return None
        grown = self.steps - self.first_steps
        if grown <= 0 or self.last_time <= self.first_seen:
            return None
        return max(0.0, (self.total - self.steps) * (self.last_time - self.first_seen) / grown)


@dataclass
class PollResult:
    """What one poll found.

    Attributes:
        runs: new run files parsed (rows added).
        changed: run files written again (an unfinished run that progressed).
        events: event lines read.
        notes: what happened to the followed files (truncated, replaced, unreadable lines).
        versions: machines whose live version changed (versions.json written: a commit, a revert).
    """

    runs: int = 0
    changed: int = 0
    events: int = 0
    notes: list = field(default_factory=list)
    versions: int = 0


class DashboardState:
    """The dashboard's data: a workspace read once, then followed by `poll()`; drawn by `html()`.

    Args:
        workspace: the workspace root (holding `.machine/`).
        log_dirs: more folders holding training log dirs to follow (each subfolder with a
            `metrics.jsonl` is one run), besides `<workspace>/.machine/training/`. Default None:
            also `runs/` in the current folder when it exists (where `mnb.sft` writes by default).
        runs: a `load_runs` frame of this workspace to start from (default None: loaded here).
        clock: the time source (default time.time; tests pass a fixed one to fix "today").
        file_events: take new run files from the operating system's file events where it reports
            them (default True; False: list the run folders that changed on every poll, e.g. on a
            network mount that reports no events). See store.follow.RunFolderWatch.

    Raises:
        ValueError: `runs` is a frame of another workspace (its `attrs["workspace"]`).

    `poll()` reads what changed and applies it; `read()` + `apply()` split the same work into
    the part that reads files (any thread) and the part that changes the state (one thread).

    What the counts mean, per machine: runs, every run file read (each machine and id once);
    running, runs whose file has no finishedAt yet or whose `run.started` event has no
    `run.finished` (or failure) event after it; finished today, runs whose finishedAt is on the
    clock's UTC day (or later), asked when the counts are shown, so they start again at midnight;
    failed, `run.failed` / `run.error` / `run.crashed` events (failed today, those whose ISO time,
    its offset applied, is on that day); cost so far, each finished run's
    `usage.costUsd`, else its input tokens at the model's prefill price plus its output tokens at
    the sample price (`pricing.price_for`, the table `estimate_cost` prices from; the price's
    source is listed), "unpriced" for runs with tokens but no known price. A truncated or replaced
    events file drops what was counted from its events (its lines are read again).
    """

    def __init__(self, workspace: str | os.PathLike, *, log_dirs: Iterable[str | os.PathLike] | None = None,
                 runs: Any = None, clock: Callable[[], float] = time.time, file_events: bool = True) -> None:
        from ..data import frames
        from ..store.follow import LineTail, RunFolderWatch
        from ..store.workspace import machine_dir, workspace_root

        self.workspace = workspace_root(workspace)
        self.clock = clock
        self._mdir = machine_dir(workspace)
        if runs is not None:
            ws = runs.attrs.get("workspace")
            if ws and Path(ws).resolve() != self.workspace.resolve():
                raise ValueError(f"these runs are runs of {ws}, not of {self.workspace}: pass load_runs of "
                                 "the dashboard's workspace (or leave runs out)")
        self.runs = frames.load_runs(workspace, on_error="skip") if runs is None else runs
        self._watch = RunFolderWatch(self._mdir / "runs", known=self.runs["path"].tolist(), events=file_events)
        self._events = LineTail(self._mdir / "events.jsonl")
        roots = [self._mdir / "training"]
        if log_dirs is None:
            if Path("runs").is_dir():
                roots.append(Path("runs").absolute())
        else:
            roots.extend(Path(d) for d in log_dirs)
        self._log_roots = roots
        self.machines: dict[str, _Machine] = {}
        self.events: collections.deque = collections.deque(maxlen=EVENTS_SHOWN)
        self.event_counts: collections.Counter = collections.Counter()
        self.n_events = 0
        self.notes: collections.deque = collections.deque(maxlen=8)
        self.latest: collections.deque = collections.deque(maxlen=RUNS_SHOWN)  # (key, machine, id, score, when)
        self.jobs: dict[str, _Job] = {}
        self._tails: dict[str, Any] = {}  # log dir -> its metrics LineTail (the reading side's)
        self.version = 0  # bumped by every change the view shows
        self._frames: dict[str, Any] = {}  # key -> one-row frame of a run listed (for the previewer)
        self._price_cache: dict[str, Any] = {}
        self._counted: set[str] = set()  # "machine/id" of every run counted
        self._add_frame(self.runs, initial=True)
        for m in self.machines.values():
            self._read_version(m)
        for machine in self._defined_machines():
            if machine not in self.machines:
                self.machines[machine] = _Machine(machine)
                self._read_version(self.machines[machine])
        self.apply(self.read())

    # ---------------------------------------------------------------- reading (any thread)

    def read(self, *, full: bool = False) -> dict:
        """Read what changed on disk since the last read (files only; the state is not touched).

        Args:
            full: list the run folders that changed even where file events report new runs
                (default False; see RunFolderWatch.poll).

        Returns:
            A batch for `apply`: new and rewritten runs as a frame, event lines, training rows.
        """
        changes = self._watch.poll(full=full)
        files = changes.added + changes.changed
        batch: dict[str, Any] = {"added": len(changes.added), "changed": len(changes.changed),
                                 "removed": changes.removed, "frame": None,
                                 "events": self._events.read(), "training": self._read_training(),
                                 "t": self.clock()}
        batch["bad"] = list(changes.notes)  # folders that could not be listed
        if files:
            batch["frame"], bad = self._parse(files)
            batch["bad"] += bad
        return batch

    def _parse(self, files: list[tuple[str, str, str]]) -> tuple[Any, list[str]]:
        """Run files parsed as load_runs parses them (the run index's parser): (a runs frame of the
        good ones, a note naming each bad one, its line and field)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from ..data import frames
        from ..errors import MachineFormatError
        from ..data.export import default_failed
        from ..store.index import parse_batch, sort_table

        entries = [(p, d, n, None) for p, d, n in files]
        table = parse_batch(frames.RunParser(default_failed), entries, time.time_ns())
        bad = []
        where = {(d, n): p for p, d, n in files}
        is_bad = pc.is_valid(table["error"])
        if pc.any(is_bad).as_py():
            for b in table.filter(is_bad).select(["dir", "name", "error", "error_line", "error_field"]).to_pylist():
                err = MachineFormatError(where.get((b["dir"], b["name"]), b["name"]), b["error"],
                                         line=b["error_line"], field=b["error_field"])
                bad.append(f"skipped a bad run file: {err}")
        # a time that does not parse is a note here: runs_frame would warn, from this (any) thread,
        # into whichever cell ran last
        bad_time = pc.is_valid(table["bad_time"]) if "bad_time" in table.column_names else None
        if bad_time is not None and pc.any(bad_time).as_py():
            for b in table.filter(bad_time).select(["dir", "name", "bad_time"]).to_pylist():
                bad.append(f"{where.get((b['dir'], b['name']), b['name'])} ({b['bad_time']}): does not parse as "
                           "an ISO time, kept with no time")
            i = table.column_names.index("bad_time")
            table = table.set_column(i, "bad_time", pa.nulls(len(table), table.schema.field(i).type))
        return frames.runs_frame(sort_table(table), self.workspace, None, "skip", [], None, None), bad

    def _read_training(self) -> list[tuple]:
        from ..training.runlog import CHECKPOINTS_FILE, METRICS_FILE
        from ..store.follow import LineTail

        out = []
        for root in self._log_roots:
            try:
                with os.scandir(root) as it:
                    dirs = [e for e in it if e.is_dir()]
            except OSError:
                continue
            for e in dirs:
                job = self.jobs.get(e.path)
                # the reader's own tail: reads that pile up before `apply` (the loop busy with a
                # cell) go on from where the last stopped, never from the start again
                tail = self._tails.get(e.path)
                if tail is None:
                    tail = LineTail(os.path.join(e.path, METRICS_FILE))
                    if not os.path.exists(tail.path):
                        continue
                    self._tails[e.path] = tail
                got = tail.read()
                done = None
                ck = os.path.join(e.path, CHECKPOINTS_FILE)
                try:
                    st = os.stat(ck)
                    sig = (st.st_size, st.st_mtime_ns)
                except OSError:
                    sig = None
                if job is None or (sig is not None and sig != job.ckpt_sig):
                    from .loss_plot import finished

                    done = finished(e.path)
                if job is None or got.lines or got.reset or got.notes or (done is not None and done != job.done):
                    out.append((e.path, e.name, tail, got, done, sig))
        return out

    # ---------------------------------------------------------------- applying (one thread)

    def apply(self, batch: dict) -> PollResult:
        """Apply what `read` found.

        Args:
            batch: a `read()` result (several may be applied in turn; each is applied once).

        Returns:
            What changed (PollResult).
        """
        res = PollResult()
        ev = batch["events"]
        if ev.reset:
            self._reset_events()
        res.notes.extend(ev.notes)
        for item in ev.lines:
            self._add_event(item)
        res.events = len(ev.lines)
        frame = batch["frame"]
        if frame is not None and len(frame):
            self._add_frame(frame)
        res.runs, res.changed = batch["added"], batch["changed"]
        res.notes.extend(batch.get("bad", ()))
        for path in batch["removed"]:
            res.notes.append(f"{path} was removed (its counts stay)")
        for path, name, tail, got, done, sig in batch["training"]:
            self._apply_training(path, name, tail, got, done, sig, batch["t"])
        for m in self.machines.values():
            before = m.live_version
            self._read_version(m)
            res.versions += m.live_version != before
        if res.notes:  # they quote values of the files read
            secrets = secret_values()
            res.notes = [scrub(str(n), secrets)[0] for n in res.notes]
        for note in res.notes:
            self.notes.append(note)
        if res.runs or res.changed or res.events or res.notes or res.versions or batch["training"]:
            self.version += 1
        return res

    def poll(self, *, full: bool = False) -> PollResult:
        """Read and apply what changed since the last poll.

        Args:
            full: list the run folders that changed (see `read`; default False).

        Returns:
            What changed (PollResult).
        """
        return self.apply(self.read(full=full))

    def _today(self) -> int:
        """Today's UTC day number (days since 1970-01-01) by the clock: "today" is asked when the
        counts are shown, so a dashboard left open over midnight starts its day again."""
        return int(self.clock() // 86400)

    def _add_frame(self, frame: Any, initial: bool = False) -> None:
        """Count the runs of a frame: new run files, and run files written again. A run is
        counted once (by machine and id), and its finish (finished today, score, cost) once: the
        first time it is read finished."""
        import numpy as np
        import pandas as pd

        fin = frame["finished_at"]
        scores = pd.to_numeric(frame["score"], errors="coerce")
        ids = frame["id"].astype(str).tolist()
        machines = frame["machine"].astype(str).tolist()
        finished = fin.notna().to_numpy()
        days = _day_numbers(fin)
        counted = self._counted
        finishing = np.zeros(len(frame), dtype=bool)  # rows whose finish is counted now
        for i, (name, rid) in enumerate(zip(machines, ids)):
            m = self.machines.get(name)
            if m is None:
                m = self.machines[name] = _Machine(name)
            key = f"{name}/{rid}"
            new = key not in counted
            if new:
                counted.add(key)
                m.runs += 1
            if finished[i]:
                if new or rid in m.unfinished_files:
                    finishing[i] = True
                    m.unfinished_files.discard(rid)
                    m.running.discard(rid)
                    m.finished_days[days[i]] += 1
            elif new or rid in m.unfinished_files:
                m.unfinished_files.add(rid)
                m.running.add(rid)
        # recent scores: the most recently finished runs of each machine
        part = pd.DataFrame({"machine": machines, "fin": fin.to_numpy(), "score": scores.to_numpy()})[finishing].dropna()
        if len(part):
            for name, g in part.sort_values("fin", kind="stable").groupby("machine", sort=False):
                self.machines[name].scores.extend(float(v) for v in g["score"].tail(SCORES_SHOWN))
        self._add_costs(frame[finishing])  # a run's cost counts once, when it has finished
        # watch unfinished run files for their rewrite; list the newest in "latest runs"
        paths = frame["path"].tolist()
        for i in np.flatnonzero(~finished).tolist():
            d = os.path.relpath(os.path.dirname(paths[i]), self._watch.root).replace(os.sep, "/")
            self._watch.watch(paths[i], "" if d == "." else d, os.path.basename(paths[i]))
        for i in np.flatnonzero(finished).tolist() if not initial else []:
            self._watch.unwatch(paths[i])
        order = np.argsort(frame["started_at"].to_numpy(dtype="datetime64[us]", na_value=np.datetime64("NaT")),
                           kind="stable")
        for i in order[-RUNS_SHOWN:].tolist():
            key = f"{machines[i]}/{ids[i]}"
            self.latest.appendleft((key, machines[i], ids[i], _num(scores.iloc[i]), finished[i]))
            self._frames[key] = frame.iloc[[i]]
        # one entry per run (a rewritten run moves to the top), at most RUNS_SHOWN
        seen, kept = set(), []
        for entry in self.latest:
            if entry[0] not in seen:
                seen.add(entry[0])
                kept.append(entry)
        self.latest = collections.deque(kept[:RUNS_SHOWN], maxlen=RUNS_SHOWN)
        listed = {e[0] for e in self.latest}
        for key in [k for k in self._frames if k not in listed]:
            del self._frames[key]

    def _price(self, model: str) -> Any:
        if model not in self._price_cache:
            from ..checks.pricing import price_for

            self._price_cache[model] = price_for(model, strict=False)
        return self._price_cache[model]

    def _add_costs(self, frame: Any) -> None:
        """Cost so far: usage.costUsd where the harness recorded it, else tokens priced as
        estimate_cost prices them (prefill and sample prices, with the price's source)."""
        import pandas as pd

        cost = pd.to_numeric(frame["cost_usd"], errors="coerce")
        inp = pd.to_numeric(frame["input_tokens"], errors="coerce")
        out = pd.to_numeric(frame["output_tokens"], errors="coerce")
        part = pd.DataFrame({"machine": frame["machine"].astype(str), "model": frame["model"].astype(str),
                             "cost": cost, "inp": inp.fillna(0), "out": out.fillna(0),
                             "has_tokens": inp.notna() | out.notna()})
        reported = part[part["cost"].notna()].groupby("machine")["cost"].sum()
        for name, v in reported.items():
            m = self.machines[name]
            m.reported_usd += float(v)
            m.sources.add("usage.costUsd recorded by the harness")
        rest = part[part["cost"].isna() & part["has_tokens"]]
        for (name, model), g in rest.groupby(["machine", "model"]):
            m = self.machines[name]
            price = self._price(model)
            if price is None or price.prefill is None or price.sample is None:
                m.unpriced += len(g)
                continue
            m.priced_usd += (float(g["inp"].sum()) * price.prefill + float(g["out"].sum()) * price.sample) / 1e6
            m.sources.add(f"{price.source} ({price.date})" if price.date else (price.source or "machine_nb.checks.pricing"))

    def _defined_machines(self) -> list[str]:
        from ..store.workspace import list_machines

        try:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return list_machines(self.workspace)
        except OSError:
            return []

    def _read_version(self, m: _Machine) -> None:
        """The machine's live version (versions.json), read again when that file changes. A name
        that is not a Machine name (an event's "../x", "") has no versions file: none is read for it."""
        from ..store.workspace import name_segments

        try:
            path = self.workspace.joinpath("machines", *name_segments(m.name), "versions.json")
        except ValueError:
            m.live_version = None
            return
        try:
            st = os.stat(path)
            sig = (st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:
            sig = None
        if sig == m.versions_sig:
            return
        m.versions_sig = sig
        if sig is None:
            m.live_version = None
            return
        from ..core.jsonl import open_regular

        try:
            with open_regular(path) as f:  # a FIFO is refused, not waited on (this runs on the kernel's loop)
                versions = json.loads(f.read())
        except (OSError, ValueError):  # MachineFormatError is a ValueError
            return  # mid-write, unreadable or not a regular file: the last version read stays
        if isinstance(versions, list) and versions:
            live = next((v.get("id") for v in reversed(versions) if isinstance(v, dict) and v.get("live")), None)
            m.live_version = live or (versions[-1].get("id") if isinstance(versions[-1], dict) else None)

    # ---------------------------------------------------------------- events

    def _reset_events(self) -> None:
        """The events file was truncated or replaced: what was counted from it is dropped (the
        new file is read from its start, so nothing is counted twice)."""
        self.events.clear()
        self.event_counts.clear()
        self.n_events = 0
        for m in self.machines.values():
            m.failed = 0
            m.failed_days.clear()
            m.running = set(m.unfinished_files)

    def _add_event(self, item: Any) -> None:
        self.n_events += 1
        ev = item.value
        if item.error is not None or not isinstance(ev, dict):
            self.event_counts["(unreadable)" if item.error else "(not an object)"] += 1
            self.events.appendleft({"line": item.line, "type": None, "raw": item.text,
                                    "error": item.error or "not a JSON object"})
            return
        entry = {"line": item.line, **event_fields(ev)}
        etype, machine, run, when = entry["type"], entry["machine"], entry["run"], entry["time"]
        self.event_counts[str(etype) if etype is not None else "(no type)"] += 1
        known = etype in STARTED_TYPES or etype in FINISHED_TYPES or etype in FAILED_TYPES
        if not known:
            entry["raw"] = item.text  # whatever Machine writes is shown whole, never dropped
        self.events.appendleft(entry)
        if machine is None or run is None:
            return
        m = self.machines.get(str(machine))
        if m is None:
            m = self.machines[str(machine)] = _Machine(str(machine))
            self._read_version(m)
        rid = str(run)
        if etype in STARTED_TYPES:
            m.running.add(rid)
        elif etype in FINISHED_TYPES:
            m.running.discard(rid)
        elif etype in FAILED_TYPES:
            m.running.discard(rid)
            m.failed += 1
            day = _event_day(when)
            if day is not None:
                m.failed_days[day] += 1

    # ---------------------------------------------------------------- training

    def _apply_training(self, path: str, name: str, tail: Any, got: Any, done: bool | None, sig: Any,
                        now: float) -> None:
        from ..training.runlog import LOSS_METRICS, read_marker

        job = self.jobs.get(path)
        if job is None:
            job = self.jobs[path] = _Job(name, path, tail)
            marker = read_marker(path)
            est = marker.get("estimate") if isinstance(marker.get("estimate"), dict) else {}
            total = marker.get("steps") if isinstance(marker.get("steps"), int) else est.get("steps")
            job.total = total if isinstance(total, int) and total > 0 else None
        if got.reset:
            job.points, job.steps, job.first_seen, job.first_steps = [], 0, None, 0
        for item in got.lines:
            row = item.value
            if not isinstance(row, dict):
                continue
            step = row.get("step")
            # a step that is not a finite number (JSON's NaN, Infinity) counts as the next one
            step = (int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) and math.isfinite(step)
                    else job.steps)
            key = next((k for k in LOSS_METRICS if isinstance(row.get(k), (int, float))
                        and not isinstance(row.get(k), bool)), None)
            loss = _loss(row[key]) if key is not None else None
            if job.metric is None and loss is not None:
                job.metric = key
            job.steps = max(job.steps, step + 1)
            prog = _num(row.get("progress"))
            if job.total is None and prog and prog > 0 and math.isfinite(guess := (step + 1) / prog):
                job.total = max(job.steps, round(guess))
            if loss is not None:
                job.points.append((step, loss))
        if len(job.points) > LOSS_POINTS:  # every other point of the older half: the curve keeps its shape
            half = len(job.points) // 2
            job.points = job.points[:half:2] + job.points[half:]
        if got.lines:
            if job.first_seen is None:
                job.first_seen, job.first_steps = now, job.steps
            job.last_time = now
        if done is not None:
            job.done = done
            job.ckpt_sig = sig

    # ---------------------------------------------------------------- views of the state

    def close(self) -> None:
        """Stop the file events the run folders are followed by (`poll` lists folders from then on)."""
        self._watch.close()

    def run_frame(self, key: str) -> Any:
        """The one-row runs frame of a run listed in "latest runs" (for the previewer).

        Args:
            key: "machine/id", as the view's `data-run` attribute names it.

        Returns:
            The frame.

        Raises:
            KeyError: the run is not listed.
        """
        if key in self._frames:
            return self._frames[key]
        raise KeyError(f"no run {key!r} among the latest runs")

    def snapshot(self) -> dict:
        """The state as plain data (what the page's JSON endpoint also serves, besides the HTML).

        Returns:
            {"version", "runs", "events", "machines": [{name, live_version, runs, running,
            finished_today, failed, failed_today, scores, cost_usd, cost_sources, unpriced}],
            "event_counts", "latest": [{key, machine, id, score, finished}], "jobs": [{name,
            path, steps, total, eta_s, done, last_loss}], "notes"}. A loss that is NaN or infinite
            (a run that diverged) is None here, so the data stays valid JSON; `html()` shows it.
        """
        today = self._today()
        return {
            "version": self.version,
            "runs": sum(m.runs for m in self.machines.values()),
            "events": self.n_events,
            "machines": [{"name": m.name, "live_version": m.live_version, "runs": m.runs,
                          "running": len(m.running), "finished_today": _since(m.finished_days, today),
                          "failed": m.failed, "failed_today": _since(m.failed_days, today), "scores": list(m.scores),
                          "cost_usd": round(m.reported_usd + m.priced_usd, 9), "cost_sources": sorted(m.sources),
                          "unpriced": m.unpriced} for m in sorted(self.machines.values(), key=lambda m: m.name)],
            "event_counts": dict(self.event_counts),
            "latest": [{"key": k, "machine": mm, "id": i, "score": s, "finished": bool(f)}
                       for k, mm, i, s, f in self.latest],
            "jobs": [{"name": j.name, "path": j.path, "steps": j.steps, "total": j.total, "eta_s": j.eta_s(),
                      "done": j.done, "last_loss": _finite(j.points[-1][1]) if j.points else None}
                     for j in self.jobs.values()],
            "notes": list(self.notes),
        }

    def html(self, *, when: str | None = None) -> str:
        """The dashboard as HTML (the live view, the static fallback and the page all show this).

        Args:
            when: the "as of" time shown (default None: now, UTC, to the second).

        Returns:
            The HTML fragment, inside an element math typesetters skip (dollar amounts stay text).
        """
        when = when or _dt.datetime.fromtimestamp(self.clock(), _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        snap = self.snapshot()
        cell = f"padding:2px 8px;border-bottom:1px solid {BORDER};text-align:left;vertical-align:top;color:{FG}"
        head = f"{cell};font-weight:600;background:{BG_ALT}"
        muted = f"color:{FG_MUTED}"
        parts = [f'<div class="mnb-dashboard" style="color:{FG};font-size:13px">',
                 f'<p style="margin:2px 0"><b>{escape(self.workspace.name)}</b> · '
                 f'{snap["runs"]:,} runs · {snap["events"]:,} events · '
                 f'<span style="{muted}">as of {escape(when)}</span></p>']
        # machines
        rows = []
        for m in snap["machines"]:
            cost = _usd(m["cost_usd"]) + (f" (+{m['unpriced']:,} unpriced)" if m["unpriced"] else "")
            source = "; ".join(m["cost_sources"]) or "no cost recorded"
            failed = f'<span style="color:{text_colour(RED)}">{m["failed"]:,}</span>' if m["failed"] else "0"
            rows.append(
                f'<tr data-machine="{escape(m["name"])}"><td style="{cell}"><b>{escape(m["name"])}</b></td>'
                f'<td style="{cell}">{escape(m["live_version"] or "—")}</td>'
                f'<td style="{cell}" class="mnb-running">{m["running"]:,}</td>'
                f'<td style="{cell}">{m["finished_today"]:,}</td>'
                f'<td style="{cell}">{failed}</td>'
                f'<td style="{cell}" class="mnb-runs">{m["runs"]:,}</td>'
                f'<td style="{cell}">{sparkline(m["scores"], lo=0.0, hi=1.0, colour=text_colour(GREEN))}</td>'
                f'<td style="{cell}" title="{escape(source)}">{escape(cost)}'
                f'<div style="{muted};font-size:11px">{escape(source)}</div></td></tr>')
        parts.append(
            '<table class="mnb-machines" style="border-collapse:collapse;margin:4px 0"><thead><tr>'
            + "".join(f'<th style="{head}">{h}</th>' for h in
                      ("machine", "live version", "running", "finished today", "failed", "runs",
                       "recent scores", "cost so far"))
            + f'</tr></thead><tbody>{"".join(rows) or f"<tr><td style={chr(34)}{cell}{chr(34)}>no machines yet</td></tr>"}'
            + '</tbody></table>')
        # latest runs | events
        runs_html = "".join(
            f'<li><a href="#" class="mnb-run" data-run="{escape(r["key"])}" title="open in the previewer" '
            f'style="color:{text_colour(BLUE)}">{escape(r["machine"])}/{escape(r["id"])}</a>'
            f' <span style="{muted}">{"score " + format(r["score"], ".2f") if r["score"] is not None else ("finished" if r["finished"] else "running")}</span></li>'
            for r in snap["latest"])
        ev_items = []
        secrets: list[str] | None = None
        for e in self.events:
            if "shown" not in e:  # each event's text redacted once, when first drawn
                secrets = secret_values() if secrets is None else secrets
                e["shown"] = _shown_event(e, secrets)
            t = e["shown"]
            if e.get("error"):
                ev_items.append(f'<li><span style="color:{text_colour(ORANGE)}">line {e["line"]}: {escape(t["error"])}</span>'
                                f' <code>{escape(t["raw"])}</code></li>')
                continue
            label = escape(t["type"] if t["type"] is not None else "(no type)")
            what = " ".join(escape(x) for x in (t["machine"], t["run"]) if x is not None)
            raw = f' <code style="{muted}">{escape(t["raw"])}</code>' if "raw" in e else ""
            key = f'{e["machine"]}/{e["run"]}' if e.get("machine") is not None and e.get("run") is not None else None
            link = (f'<a href="#" class="mnb-run" data-run="{escape(key)}" style="color:{text_colour(BLUE)}">{what}</a>'
                    if key is not None and key in self._frames else what)
            ev_items.append(f'<li><b>{label}</b> {link}'
                            f' <span style="{muted}">{escape(t["time"] or "")}</span>{raw}</li>')
        counts = " · ".join(f"{escape(k)} {v:,}" for k, v in sorted(snap["event_counts"].items()))
        parts.append(
            '<div style="display:flex;flex-wrap:wrap;gap:16px">'
            f'<div style="flex:1 1 280px;min-width:240px"><b>latest runs</b>'
            f'<ul class="mnb-latest" style="margin:2px 0;padding-left:18px">{runs_html or "<li>none yet</li>"}</ul></div>'
            f'<div style="flex:2 1 420px;min-width:280px"><b>events</b> <span style="{muted}">{counts}</span>'
            f'<ul class="mnb-events" style="margin:2px 0;padding-left:18px;max-height:18em;overflow:auto">'
            f'{"".join(ev_items) or "<li>none yet</li>"}</ul></div></div>')
        # training
        if snap["jobs"]:
            jobs = []
            for j, job in zip(snap["jobs"], self.jobs.values()):
                status = "done" if j["done"] else (f"ETA {_duration(j['eta_s'])}" if j["eta_s"] is not None else "training")
                total = f"/{j['total']:,}" if j["total"] else ""
                loss = f"{job.points[-1][1]:.4g}" if job.points else "—"  # "nan" / "inf" said as such
                curve = sparkline([p[1] for p in job.points], width=200, height=32, colour=text_colour(BLUE))
                jobs.append(f'<tr><td style="{cell}">{escape(j["name"])}</td><td style="{cell}">{j["steps"]:,}{total}</td>'
                            f'<td style="{cell}">{escape(loss)}</td><td style="{cell}">{curve}</td>'
                            f'<td style="{cell}">{escape(status)}</td></tr>')
            parts.append('<b>training</b><table class="mnb-jobs" style="border-collapse:collapse;margin:4px 0"><thead><tr>'
                         + "".join(f'<th style="{head}">{h}</th>' for h in ("run", "steps", "loss", "loss curve", "status"))
                         + f'</tr></thead><tbody>{"".join(jobs)}</tbody></table>')
        if snap["notes"]:
            parts.append(f'<div class="mnb-notes" style="{muted}">'
                         + "".join(f"<div>{escape(n)}</div>" for n in snap["notes"]) + "</div>")
        parts.append("</div>")
        return no_math("".join(parts))


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


# ---------------------------------------------------------------- following in the background

#: How many errors a Follower keeps: the last of those since its last good read.
ERRORS_KEPT = 20


class Follower:
    """Poll a DashboardState in a background thread; apply what it read on an event loop.

    Args:
        state: the DashboardState.
        on_change: called (on the loop, or in the thread without one) after each batch is
            applied, with the merged PollResult and the batches applied.
        interval: seconds between checks (default INTERVAL_S).
        loop: the asyncio loop that applies batches (default None: the loop running in the
            thread that calls start(), e.g. the kernel's; without one, batches are applied in
            the follower's thread, so the state is then best read through `poll_now`).
        on_errors: called as on_change is, with `errors`, when a read fails after one that
            worked, and when one works after failing (default None).

    Reads (file I/O and parsing) happen in the thread without holding up the loop; batches are
    applied on the loop in the order they were read. `errors` holds what went wrong (a read, or
    on_change) since the last read that succeeded, redacted, the last ERRORS_KEPT of them.
    """

    def __init__(self, state: DashboardState, on_change: Callable[[PollResult, list], Any], *,
                 interval: float = INTERVAL_S, loop: asyncio.AbstractEventLoop | None = None,
                 on_errors: Callable[[list[str]], Any] | None = None) -> None:
        self.state = state
        self.on_change = on_change
        self.on_errors = on_errors
        self.interval = interval
        self.loop = loop
        self.lock = threading.Lock()        # the pending batches
        self.read_lock = threading.Lock()   # one read at a time (the followers' offsets)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending: list[dict] = []
        self._scheduled = False
        self.errors: list[str] = []

    @property
    def running(self) -> bool:
        """Whether the thread is following."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start following (no-op when already following)."""
        if self.running:
            return
        if self.loop is None:
            try:
                self.loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
                try:
                    from tornado.ioloop import IOLoop

                    loop = IOLoop.current().asyncio_loop  # the kernel's loop, outside a coroutine
                except Exception:  # no tornado, or no loop in this thread
                    loop = None
                self.loop = loop if loop is not None and loop.is_running() else None
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mnb-dashboard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following (waits for the thread)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            failing = bool(self.errors)
            try:
                with self.read_lock:
                    batch = self.state.read()
                self.errors = []  # read again: what went wrong before is over
            except Exception as exc:  # a file system error: said in the view, following goes on
                self._said(exc)
                batch = None
            if failing != bool(self.errors) and self.on_errors is not None:
                self._call_on_loop(self.on_errors, list(self.errors))
            if batch is not None:
                with self.lock:
                    self._pending.append(batch)
                    schedule = not self._scheduled
                    self._scheduled = True
                if schedule:
                    if self.loop is not None and not self.loop.is_closed():
                        try:
                            self.loop.call_soon_threadsafe(self._apply_pending)
                        except RuntimeError:  # the loop closed meanwhile
                            return
                    else:
                        self._apply_pending()
            self._stop.wait(self.interval)

    def _call_on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        """fn(*args) on the loop (in this thread without one); a callback that fails is kept among
        the errors, never ends the following."""
        def call() -> None:
            try:
                fn(*args)
            except Exception as exc:
                self._said(exc)

        if self.loop is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(call)
            except RuntimeError:  # the loop closed meanwhile
                pass
        else:
            call()

    def poll_now(self, *, full: bool = False) -> tuple[PollResult, list[dict]]:
        """Read now, then apply every batch not applied yet (the thread's first, in order);
        on_change is not called.

        Args:
            full: see DashboardState.read.

        Returns:
            (what changed, the batches applied).
        """
        with self.read_lock:
            batch = self.state.read(full=full)
        with self.lock:
            self._pending.append(batch)
        return self._apply()

    def _apply(self) -> tuple[PollResult, list[dict]]:
        with self.lock:
            batches, self._pending, self._scheduled = self._pending, [], False
        merged = PollResult()
        for b in batches:  # coalesced: every batch applied once, in order, then one redraw
            r = self.state.apply(b)
            merged.runs += r.runs
            merged.changed += r.changed
            merged.events += r.events
            merged.notes.extend(r.notes)
            merged.versions += r.versions
        return merged, batches

    def _apply_pending(self) -> None:
        merged, batches = self._apply()
        if not batches:
            return
        try:
            self.on_change(merged, batches)
        except Exception as exc:  # a broken callback must not stop following
            self._said(exc)

    def _said(self, exc: Exception) -> None:
        """Keep an error, redacted, with the last ERRORS_KEPT - 1 before it."""
        self.errors = [*self.errors[-(ERRORS_KEPT - 1):], redacted(f"{type(exc).__name__}: {exc}")]


# ---------------------------------------------------------------- the widget

_ESM = """
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "mnb-dashboard-view";
  el.appendChild(root);
  const draw = () => { root.innerHTML = model.get("html"); };
  root.addEventListener("click", (e) => {
    const a = e.target.closest("[data-run]");
    if (!a) return;
    e.preventDefault();
    model.send({ event: "open", key: a.dataset.run });
  });
  model.on("change:html", draw);
  draw();
}
export default { render };
"""


class DashboardView(anywidget.AnyWidget):
    """The dashboard's HTML, redrawn when it changes; a click on a run is sent back
    ({"event": "open", "key": "machine/id"})."""

    _esm = _ESM
    html = traitlets.Unicode("").tag(sync=True)


class Dashboard(StaticFallback, w.VBox):
    """A live view of a workspace: per machine its live version, runs running now / finished
    today / failed, recent scores and cost so far (with the price's source); the latest events
    (unknown types shown whole); training runs with loss curves, steps and ETA. A click on a run
    opens it in the previewer below. It follows the files while it is shown, without re-running
    a cell.

    Args:
        workspace: the workspace root (holding `.machine/`).
        log_dirs: more folders of training log dirs to follow (see DashboardState).
        runs: a `load_runs` frame of the workspace to start from (default None: loaded here).
        interval: seconds between checks of the files (default INTERVAL_S).
        follow: start following now (default True; False: call `poll()` or `start()`).
        file_events: see DashboardState (default True).
        **kwargs: passed to ipywidgets.VBox.

    Raises:
        ValueError: `runs` is a frame of another workspace.

    `picker` is a RunPicker of the same runs that gains new runs as they land; `follow(picker)`
    makes any RunPicker of this workspace do the same. `stop()` stops following; `close()` also
    closes the previewer and `picker` (a picker passed to `follow` stays open, no longer fed).
    A saved notebook shows the dashboard as it was at the last update.
    """

    def __init__(self, workspace: str | os.PathLike, *, log_dirs: Iterable[str | os.PathLike] | None = None,
                 runs: Any = None, interval: float = INTERVAL_S, follow: bool = True, file_events: bool = True,
                 **kwargs: Any) -> None:
        self.state = DashboardState(workspace, log_dirs=log_dirs, runs=runs, file_events=file_events)
        self._read_errors: list[str] = []  # the Follower's since its last good read, shown under the view
        self._view = DashboardView(html=self._html())
        self._view.on_msg(self._on_msg)
        self._preview_box = w.VBox()
        from .previewer import ExamplePreviewer

        # made now, shown on the first click: a first click then costs no imports
        self.previewer = ExamplePreviewer([])
        self.previewer._static_within(self)  # stepping through it updates the saved dashboard
        self._pickers: list[Any] = []
        self._picker_rows: list[Any] = []
        self._landed: list[Any] = []  # every frame of new rows since the dashboard was made
        self._feeding = False  # a worker thread is preparing the pickers' next frames
        self._picker_time = 0.0
        self._picker: Any = None
        self.picker_interval = PICKER_INTERVAL_S
        self.opened: str | None = None
        self._closed = False  # a batch read before close() lands on the loop after it: dropped
        self._follower = Follower(self.state, self._on_change, interval=interval, on_errors=self._errors_changed)
        super().__init__(children=[self._view, self._preview_box], **kwargs)
        self.add_class("mnb-dashboard-widget")
        if follow:
            self.start()

    # following
    def start(self) -> None:
        """Follow the workspace's files in the background (the view updates itself).

        Raises:
            RuntimeError: the dashboard is closed.
        """
        self._refuse_if_closed("start following")
        self._follower.start()

    def stop(self) -> None:
        """Stop following (the view keeps what it shows)."""
        self._follower.stop()
        self.state.close()

    @property
    def following(self) -> bool:
        """Whether the dashboard is following the files now."""
        return self._follower.running

    def close(self) -> None:
        """Stop following, stop feeding the pickers (one passed to `follow` stays open: it is the
        caller's), and close the widget with every widget it made: its view, its previewer
        (shown or not) and `picker`."""
        self._closed = True
        if getattr(self, "_follower", None) is not None:  # also called for a half-made dashboard
            self.stop()
        self._pickers, self._picker_rows, self._landed = [], [], []
        super().close()

    def _refuse_if_closed(self, what: str) -> None:
        """What a closed dashboard would start or hand out would never be fed nor closed: refuse it."""
        if self._closed:
            raise RuntimeError(f"this Dashboard is closed: it cannot {what}; make a new one")

    def _made_widgets(self) -> list[Any]:
        """The previewer (a child from the first click on) and `picker` (never a child)."""
        return [getattr(self, "previewer", None), getattr(self, "_picker", None)]

    def poll(self, *, full: bool = False) -> PollResult:
        """Read and show what changed now (what following does every `interval` seconds).

        Args:
            full: list the run folders that changed (see DashboardState.read; default False).

        Returns:
            What changed (PollResult).
        """
        res, batches = self._follower.poll_now(full=full)
        self._on_change(res, batches, force_picker=True)
        return res

    def _on_change(self, res: PollResult, batches: list[dict], force_picker: bool = False) -> None:
        if self._closed:
            return
        for b in batches:
            if b["frame"] is not None and len(b["frame"]):
                self._picker_rows.append(b["frame"])
                self._landed.append(b["frame"])
        if not self._pickers:
            self._picker_rows = []
        if len(self._landed) > 64:  # one frame of everything that landed, for pickers that come later
            self._landed = [self._merged(self._landed)]
        if self._pickers and self._picker_rows and (
                force_picker or time.monotonic() - self._picker_time >= self.picker_interval):
            self._feed_pickers(wait=force_picker)
        if (res.runs or res.changed or res.events or res.notes or res.versions
                or any(b["training"] for b in batches)):
            self._view.html = self._html()
            self._static_changed()

    def _errors_changed(self, errors: list[str]) -> None:
        """The workspace could not be read (or can again): said under the view until a read works."""
        if self._closed:
            return
        self._read_errors = errors[-3:]
        self._view.html = self._html()
        self._static_changed()

    def _html(self) -> str:
        """The state's HTML, and the errors of reading the workspace since the last good read."""
        if not self._read_errors:
            return self.state.html()
        said = "".join(f"<div>reading the workspace: {escape(e)}</div>" for e in self._read_errors)
        return self.state.html() + no_math(f'<div class="mnb-read-errors" style="color:{text_colour(RED)}">{said}</div>')

    @staticmethod
    def _merged(frames: list) -> Any:
        """Frames of new rows as one, a run written more than once by its last row."""
        import pandas as pd

        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        return frame.drop_duplicates(subset=["machine", "id"], keep="last")

    def _feed_pickers(self, wait: bool = False) -> None:
        """Hand the rows that landed to the pickers: the new frames and their filter arrays are
        made in a worker thread (RunPicker.prepare_runs), then swapped in on the loop, so the
        kernel answers clicks meanwhile; with `wait`, or without a loop, here and now."""
        if self._feeding:
            return  # the rows wait for the next round
        rows, self._picker_rows = self._picker_rows, []
        frame = self._merged(rows)
        pickers = list(self._pickers)
        loop = self._follower.loop
        if wait or loop is None or loop.is_closed():
            for p in pickers:
                p.add_runs(frame)
            self._picker_time = time.monotonic()
            return
        self._feeding = True

        def finish(prepared: list) -> None:
            try:
                for p, ready in prepared if not self._closed else ():
                    p.add_runs(ready)
            finally:
                self._feeding = False
                self._picker_time = time.monotonic()
            if self._picker_rows:  # rows that landed meanwhile: the next round now
                self._feed_pickers()

        def work() -> None:
            prepared = []
            for p in pickers:
                try:
                    prepared.append((p, p.prepare_runs(frame)))
                except Exception:  # made again (and its error seen) on the loop
                    prepared.append((p, frame))
            try:
                loop.call_soon_threadsafe(finish, prepared)
            except RuntimeError:  # the loop closed
                self._feeding = False

        threading.Thread(target=work, name="mnb-dashboard-picker", daemon=True).start()

    # the picker
    def follow(self, picker: Any) -> Any:
        """Give a RunPicker of this workspace the runs that land from now on (newest first, at the top).

        Args:
            picker: a RunPicker made from `load_runs` of this workspace.

        Returns:
            The picker.

        Raises:
            ValueError: the picker's runs come from another workspace.
            RuntimeError: the dashboard is closed.
        """
        self._refuse_if_closed("follow a picker")
        ws = getattr(picker, "runs", None) is not None and picker.runs.attrs.get("workspace")
        if ws and Path(ws).resolve() != self.state.workspace.resolve():
            raise ValueError(f"this RunPicker shows runs of {ws}, not of {self.state.workspace}: "
                             "make it from load_runs of the dashboard's workspace")
        if picker not in self._pickers:
            if self._landed:  # what landed before: rows it has are replaced, not added twice
                picker.add_runs(self._merged(self._landed))
            self._pickers.append(picker)
        return picker

    @property
    def picker(self) -> Any:
        """A RunPicker of the workspace's runs that gains new runs as they land (made on first use;
        RuntimeError once the dashboard is closed)."""
        if self._picker is None:
            self._refuse_if_closed("make a picker")
            from .run_picker import RunPicker

            self._picker = self.follow(RunPicker(self.state.runs))
        return self._picker

    # opening a run
    def open_run(self, key: str) -> None:
        """Show a run of "latest runs" in the previewer (what a click on it does).

        Args:
            key: "machine/id".

        Raises:
            KeyError: the run is not among the latest runs.
            RuntimeError: the dashboard is closed.
        """
        self._refuse_if_closed("open a run")
        frame = self.state.run_frame(key)
        from .previewer import load_lines

        lines = load_lines(frame)
        note = "" if lines else f"{key} gives no training example (no assistant answer)."
        if not self._preview_box.children:
            self._preview_box.children = (self.previewer,)
        self.opened = key
        self.previewer.set_lines(lines, note=note)  # re-sends this dashboard's static output too

    def _on_msg(self, _widget: Any, content: dict, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("event") == "open":
            try:
                self.open_run(str(content.get("key")))
            except KeyError as exc:
                self.state.notes.append(str(exc.args[0]))
                self._view.html = self._html()

    # static fallback
    def summary(self) -> str:
        """The saved notebook's text/plain.

        Returns:
            One line: machines, runs, events.
        """
        s = self.state
        return (f"Dashboard of {s.workspace.name}: {len(s.machines)} machines, "
                f"{sum(m.runs for m in s.machines.values()):,} runs, {s.n_events:,} events")

    def static_html(self) -> str:
        """The dashboard as it stands (for the saved notebook and HTML exports).

        Returns:
            The same HTML as the live view, plus the run open in the previewer.
        """
        extra = ""
        if self.opened is not None:
            extra = f'<div class="mnb-dashboard-preview"><b>{escape(self.opened or "")}</b>{self.previewer.static_html()}</div>'
        return self._html() + extra


__all__ = ["Dashboard", "DashboardState", "DashboardView", "Follower", "PollResult", "sparkline"]
