"""LossPlot: metrics from log dirs, the debiased EMA, overlay, PNG fallback, and the live update.

The live tests append rows to metrics.jsonl the way the trainer does, check them with one
`poll()` (the check the background thread makes every refresh_s), then write the final
checkpoint row and wait for the thread to end by itself (`wait()`: joined, no clock involved).
"""

import json

from machine_nb.widgets.loss_plot import LossPlot, ema, read_metrics, smoothing_note


def write_metrics(log_dir, rows, mode="w"):
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "metrics.jsonl", mode) as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def rows(n, start=0, loss0=3.0):
    return [{"step": s, "epoch": 0, "learning_rate": 1e-4 * (1 - s / 50), "num_tokens": 100,
             "train_mean_nll": loss0 / (1 + s)} for s in range(start, start + n)]


def test_ema_is_debiased_like_tensorboard():
    assert ema([2.0, 2.0, 2.0], 0.6) == [2.0, 2.0, 2.0]  # no pull toward 0 at the start
    s = ema([1.0, 0.0], 0.5)
    assert s[0] == 1.0 and abs(s[1] - (0.25 / 0.75)) < 1e-12
    assert ema([1.0, float("nan"), 3.0], 0.0)[2] == 3.0


def test_overlay_frame_png_and_static_html(tmp_path):
    write_metrics(tmp_path / "run_a", rows(10))
    write_metrics(tmp_path / "run_b", rows(6, loss0=2.0) + [{"step": 5, "test/nll": 0.9}])
    # a partial last line, as while the trainer is writing
    with open(tmp_path / "run_b" / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 6, "train_mean')
    p = LossPlot([tmp_path / "run_a", tmp_path / "run_b"], live=False)
    assert set(p.frame["run"]) == {"run_a", "run_b"}
    assert len(p.frame[p.frame.run == "run_a"]) == 10
    assert "test/nll" in p.frame.columns
    png = p.static_png()
    assert png.startswith(b"\x89PNG")
    bundle = p._repr_mimebundle_()
    assert bundle["text/plain"].startswith("LossPlot: run_a: 10 steps")
    assert '<img alt="training loss" src="data:image/png;base64,' in bundle["text/html"]
    assert "image/png" in bundle
    assert "weight 0.6 on the previous smoothed value" in smoothing_note(0.6)


def test_live_update_from_a_growing_metrics_file(tmp_path):
    log = tmp_path / "live"
    write_metrics(log, rows(2))
    p = LossPlot(log, refresh_s=0.05)
    try:
        assert p.live
        first, png0 = p.redraws, p.static_png()
        write_metrics(log, rows(3, start=2), mode="a")
        assert p.poll() is False  # the rows are there, the run is not over
        assert len(p.frame) == 5 and p.redraws > first and p.static_png() != png0
        assert "live: 5 steps" in p.summary() and p.live
        (log / "checkpoints.jsonl").write_text(json.dumps({"name": "final", "batch": 5}) + "\n")
        assert p.wait(timeout=600)  # the thread stops by itself at the final checkpoint (the bound: a hang)
        assert not p.live and len(p.frame) == 5
    finally:
        p.stop()


def test_stop_ends_polling_and_missing_dir_is_empty(tmp_path):
    p = LossPlot(tmp_path / "not_yet", refresh_s=0.05)
    assert p.live and len(p.frame) == 0 and "no metrics yet" in p.summary()
    p.stop()
    assert not p.live
    assert read_metrics([tmp_path / "not_yet"]).empty


def test_same_named_dirs_stay_apart_and_bad_lines_are_named(tmp_path):
    import pytest

    write_metrics(tmp_path / "a" / "log", rows(3))
    write_metrics(tmp_path / "b" / "log", rows(4))
    with open(tmp_path / "b" / "log" / "metrics.jsonl", "a") as fh:
        fh.write("not json\n")
        fh.write(json.dumps({"step": 4, "train_mean_nll": 0.5}) + "\n")
    with pytest.warns(UserWarning, match="metrics.jsonl"):
        frame = read_metrics([tmp_path / "a" / "log", tmp_path / "b" / "log"])
    counts = frame.groupby("run").size().to_dict()
    assert counts == {str(tmp_path / "a" / "log"): 3, str(tmp_path / "b" / "log"): 5}


def test_fed_by_sft_the_plot_keeps_step_with_the_progress_bar(tmp_path):
    """`sft(on_metrics=plot.update)`: each time the trainer hands over new metrics rows (the rows
    the progress bar counts, in the same poll) the plot already shows them, so it never lags."""
    from machine_nb.data.corpus import make_corpus
    from machine_nb.training.train import sft

    corpus = make_corpus(tmp_path / "corpus", seed=0)
    log = tmp_path / "run"
    plot = LossPlot(log, refresh_s=3600)  # the poll thread would not wake during the run
    handed, behind = [], []

    def on_metrics(rows):
        plot.update(rows)
        handed.extend(r for r in rows if "train_mean_nll" in r)
        behind.append(len(handed) - int(plot.frame["train_mean_nll"].notna().sum()))

    try:
        result = sft(corpus.train, log_dir=log, max_steps=6, batch_size=8, seed=0, progress=False,
                     on_metrics=on_metrics)
    finally:
        plot.stop()
    assert result.steps == 6 and len(handed) == 6 and behind and max(behind) == 0, behind
    assert plot.summary().startswith("LossPlot: run: 6 steps") and not plot.live


def test_fed_faster_than_it_draws_the_data_keeps_step_and_the_picture_follows(tmp_path, monkeypatch):
    """Steps handed to `update` within REDRAW_EVERY_S of the last picture move `.frame` and the
    summary at once; the picture follows in one redraw when that time has passed, with no further
    call, and at once when the run has ended. The plot's clock is a counter moved by hand, and
    the put-off redraw runs when the test says (then once on a real timer)."""
    from types import SimpleNamespace

    from machine_nb.widgets import loss_plot
    from machine_nb.widgets.loss_plot import REDRAW_EVERY_S, figure, png_bytes

    now = [1000.0]
    monkeypatch.setattr(loss_plot, "time", SimpleNamespace(monotonic=lambda: now[0]))
    log = tmp_path / "run"
    write_metrics(log, rows(1))
    p = LossPlot(log, refresh_s=3600)
    real_later, later = p._later, []
    p._later = lambda wait, fn: later.append((wait, fn)) or SimpleNamespace(cancel=lambda: None)
    current = lambda: p.static_png() == png_bytes(figure(p.frame, p.smoothing))  # noqa: E731
    try:
        drawn, png = p.redraws, p.static_png()
        for s in range(1, 6):  # five steps within REDRAW_EVERY_S of the first picture
            now[0] += REDRAW_EVERY_S / 10
            write_metrics(log, rows(1, start=s), mode="a")
            p.update()
            assert len(p.frame) == s + 1 and f"run: {s + 1} steps" in p.summary()
        assert p.redraws == drawn and p.static_png() == png
        # one redraw put off, for when REDRAW_EVERY_S has passed since the picture; it draws all five
        ((wait, redraw),) = later
        assert abs(wait - REDRAW_EVERY_S * 0.9) < 1e-9
        now[0] += REDRAW_EVERY_S
        redraw()
        assert p.redraws == drawn + 1 and current()
        # a step long after the last picture is drawn at once
        now[0] += 2 * REDRAW_EVERY_S
        write_metrics(log, rows(1, start=6), mode="a")
        p.update()
        assert p.redraws == drawn + 2 and current() and len(later) == 1
        # a step right after it, on the real timer: drawn by the time the timer has run
        timers = []
        p._later = lambda wait, fn: timers.append(real_later(wait, fn)) or timers[-1]
        write_metrics(log, rows(1, start=7), mode="a")
        p.update()
        assert len(p.frame) == 8
        timers[0].join(timeout=600)  # the bound: a hang
        assert p.redraws == drawn + 3 and current()
        # the run's end is drawn at once, however soon after the last picture
        write_metrics(log, rows(1, start=8), mode="a")
        (log / "checkpoints.jsonl").write_text(json.dumps({"name": "final", "batch": 9}) + "\n")
        p.update()
        assert p.redraws == drawn + 4 and "run: 9 steps" in p.summary() and current()
    finally:
        p.stop()


def test_update_during_a_redraw_in_another_thread_waits_for_its_data(tmp_path, monkeypatch):
    """A redraw in another thread (the poll, or a put-off one) reads the files, new rows included,
    and draws; `update` for those rows, called meanwhile, returns with `.frame` holding them. The
    drawing thread is held inside the drawing until `update` has either returned or waits for it."""
    import threading

    from machine_nb.widgets import loss_plot

    log = tmp_path / "run"
    write_metrics(log, rows(1))
    p = LossPlot(log, live=False)
    drawing, release, progressed = threading.Event(), threading.Event(), threading.Event()
    real_png = loss_plot.png_bytes

    def held_png(fig):
        if threading.current_thread().name == "redraw":
            drawing.set()
            assert release.wait(600)  # the bound: a hang
        return real_png(fig)

    class Watched:  # the plot's lock, saying when `update` starts to wait for it
        def __init__(self, lock):
            self.lock = lock

        def __enter__(self):
            if threading.current_thread().name == "update":
                progressed.set()
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    monkeypatch.setattr(loss_plot, "png_bytes", held_png)
    p._lock = Watched(p._lock)
    write_metrics(log, rows(1, start=1), mode="a")  # the new step, on disk before the redraw reads
    redraw = threading.Thread(target=p.refresh, name="redraw")
    redraw.start()
    assert drawing.wait(600)
    seen = []
    updating = threading.Thread(target=lambda: (p.update(rows(1, start=1)), seen.append(len(p.frame)),
                                                progressed.set()), name="update")
    updating.start()
    assert progressed.wait(600)
    release.set()
    redraw.join(600)
    updating.join(600)
    assert seen == [2] and len(p.frame) == 2


def test_stop_draws_the_final_state(tmp_path):
    log = tmp_path / "run"
    write_metrics(log, rows(2))
    p = LossPlot(log, refresh_s=3600)
    write_metrics(log, rows(3, start=2), mode="a")  # written after the last poll
    p.stop()
    assert len(p.frame) == 5 and "5 steps" in p.summary()


def axis_labels(frame):
    from machine_nb.widgets.loss_plot import figure

    fig = figure(frame)
    return [a.get_ylabel() for a in fig.axes], fig


def test_held_out_accuracy_gets_its_own_axis(tmp_path):
    log = tmp_path / "run"
    scored = [{**r, "test/accuracy": r["step"] / 10, "test/format_rate": min(1.0, r["step"] / 5)}
              if r["step"] % 3 == 0 else r for r in rows(10)]
    write_metrics(log, scored + [{"step": 10, "test/accuracy": 0.9, "test/format_rate": 1.0}])  # the final checkpoint
    p = LossPlot(log, live=False)
    labels, fig = axis_labels(p.frame)
    assert labels[:2] == ["loss (train_mean_nll)", "held-out"] and "learning rate (dotted)" in labels
    acc_ax = fig.axes[1]
    assert acc_ax.get_ylim() == (-0.05, 1.05)
    assert [line.get_label() for line in acc_ax.get_lines()] == ["held-out accuracy", "format rate"]
    assert list(acc_ax.get_lines()[0].get_xdata()) == [0, 3, 6, 9, 10]
    # the final checkpoint's row is no training step
    assert p.summary() == "LossPlot: run: 10 steps, last loss 0.3, held-out 90.0% at step 10 (best 90.0% at step 9)"  # the earliest of equal bests
    plain = LossPlot(tmp_path / "plain", live=False)
    write_metrics(tmp_path / "plain", rows(10))
    plain.refresh()
    assert axis_labels(plain.frame)[0] == ["loss (train_mean_nll)", "learning rate (dotted)"]


def test_inspect_task_accuracy_joins_the_held_out_panel(tmp_path):
    """sft/dpo(inspect_tasks=…) log `test/inspect/<task>/accuracy`: a line per task beside the held-out
    rows' accuracy, and a panel of its own when the run scores no held-out rows."""
    log = tmp_path / "run"
    scored = [{**r, "test/accuracy": r["step"] / 10, "test/inspect/sums/accuracy": r["step"] / 20,
               "test/inspect/sums/stderr": 0.1} if r["step"] % 3 == 0 else r for r in rows(10)]
    write_metrics(log, scored)
    labels, fig = axis_labels(LossPlot(log, live=False).frame)
    assert labels[1] == "held-out"
    lines = {line.get_label(): line for line in fig.axes[1].get_lines()}
    assert set(lines) == {"held-out accuracy", "Inspect sums"}  # accuracy only: no stderr line
    assert list(lines["Inspect sums"].get_xdata()) == [0, 3, 6, 9]
    assert list(lines["Inspect sums"].get_ydata()) == [0.0, 0.15, 0.3, 0.45]
    only = tmp_path / "only"
    write_metrics(only, [{**r, "test/inspect/sums/accuracy": 0.5} if r["step"] % 5 == 0 else r for r in rows(10)])
    labels, fig = axis_labels(LossPlot(only, live=False).frame)
    assert labels[1] == "held-out" and [line.get_label() for line in fig.axes[1].get_lines()] == ["Inspect sums"]


def test_dpo_runs_plot_dpo_loss_with_accuracy_and_margin_apart(tmp_path):
    log = tmp_path / "dpo"
    write_metrics(log, [{"step": s, "dpo_loss": 0.69 - 0.04 * s, "accuracy": 0.5 + 0.04 * s, "margin": 0.2 * s,
                         "chosen_reward": 0.1 * s, "rejected_reward": -0.1 * s, "learning_rate": 1e-5}
                        for s in range(8)])
    p = LossPlot(log, live=False)
    labels, fig = axis_labels(p.frame)
    assert labels == ["loss (dpo_loss)", "preference acc.", "learning rate (dotted)", "margin (dashed)"]
    pref = fig.axes[1]
    assert [line.get_label() for line in pref.get_lines()] == ["preference accuracy"]
    assert list(pref.get_lines()[0].get_ydata()) == [0.5 + 0.04 * s for s in range(8)]
    assert p.summary() == "LossPlot: dpo: 8 steps, last loss 0.41, preference accuracy 78.0%"
    assert p.static_png().startswith(b"\x89PNG")


def test_a_run_with_evals_is_live_until_its_final_score(tmp_path):
    log = tmp_path / "run"
    write_metrics(log, rows(3))
    (log / "machine_nb.json").write_text(json.dumps({"heldout": {"every": 3}}))
    (log / "checkpoints.jsonl").write_text(json.dumps({"name": "final", "batch": 3}) + "\n")
    p = LossPlot(log, refresh_s=0.05)
    try:
        assert p.live and not p.finished() and p.poll() is False  # the final checkpoint is scored after it is saved
        (log / "heldout.jsonl").write_text(json.dumps({"step": 3, "final": True, "rows": []}) + "\n")
        assert p.wait(timeout=600) and not p.live
    finally:
        p.stop()


def test_fed_by_sft_with_evals_the_plot_shows_held_out_accuracy(tmp_path):
    """Four held-out rows with short replies: each eval step puts a score on the plot, whatever
    the rows' number or the replies' length."""
    from machine_nb.data.corpus import make_corpus
    from machine_nb.training.train import sft

    corpus = make_corpus(tmp_path / "corpus", seed=0)
    valid = tmp_path / "valid4.jsonl"
    valid.write_text("".join(corpus.valid.read_text().splitlines(keepends=True)[:4]))
    log = tmp_path / "run"
    plot = LossPlot(log, refresh_s=3600)
    try:
        sft(corpus.train, log_dir=log, max_steps=6, eval_data=valid, eval_every=3, eval_max_tokens=8, progress=False,
            on_metrics=plot.update)
    finally:
        plot.stop()
    assert list(plot.frame["test/accuracy"].dropna().index.map(plot.frame["step"].get)) == [0, 3, 6]
    assert "held-out 0.0% at step 6" in plot.summary() and plot.finished()


def test_a_broken_run_record_leaves_the_plot_working(tmp_path):
    """The run record says whether a run scores held-out rows; one that cannot be read (here nested
    deeper than any reader should walk) counts as no evals instead of failing the plot."""
    from machine_nb.widgets.loss_plot import finished

    log = tmp_path / "run"
    write_metrics(log, rows(3))
    (log / "checkpoints.jsonl").write_text(json.dumps({"name": "final", "batch": 3}) + "\n")
    (log / "machine_nb.json").write_text("[" * 100_000 + "]" * 100_000)
    assert finished(log)
    p = LossPlot(log, live=False)
    assert p.finished() and "3 steps" in p.summary()


def test_closing_the_plot_ends_its_polling(tmp_path):
    log = tmp_path / "run"
    write_metrics(log, rows(2))  # a run that has not finished: the plot polls it
    p = LossPlot(log, refresh_s=3600)
    assert p.live
    p.close()  # the cell's output cleared, or the plot closed in code
    assert not p.live


def slow_drawings(monkeypatch) -> list[float]:
    """The plot's clock as a counter moved by hand (returned: `now[0]`), moved one second by each
    drawing, as on a machine where a picture takes a second to draw."""
    from types import SimpleNamespace

    from machine_nb.widgets import loss_plot

    now = [1000.0]
    monkeypatch.setattr(loss_plot, "time", SimpleNamespace(monotonic=lambda: now[0]))
    real_png = loss_plot.png_bytes

    def slow_png(fig):
        now[0] += 1.0
        return real_png(fig)

    monkeypatch.setattr(loss_plot, "png_bytes", slow_png)
    return now


def test_a_slow_drawing_spaces_the_redraws_by_its_own_duration(tmp_path, monkeypatch):
    """On a busy machine a picture takes longer to draw: the next redraw waits four times the last
    drawing's duration (when that is longer than REDRAW_EVERY_S), so drawing takes at most a fifth of
    the time however slow it gets, and the training it shows keeps the rest. The plot's clock is a
    counter moved by hand; each drawing moves it by one second."""
    from types import SimpleNamespace

    from machine_nb.widgets.loss_plot import REDRAW_EVERY_S

    now = slow_drawings(monkeypatch)
    log = tmp_path / "run"
    write_metrics(log, rows(1))
    p = LossPlot(log, refresh_s=3600)
    later = []
    p._later = lambda wait, fn: later.append((wait, fn)) or SimpleNamespace(cancel=lambda: None)
    try:
        drawn = p.redraws
        now[0] += 2 * REDRAW_EVERY_S + 1.0  # past REDRAW_EVERY_S, within four drawings' time
        write_metrics(log, rows(1, start=1), mode="a")
        p.update()
        assert p.redraws == drawn and len(p.frame) == 2  # the data at once, the picture put off
        ((wait, redraw),) = later
        assert abs(wait - (4.0 - 2 * REDRAW_EVERY_S - 1.0)) < 1e-9
        now[0] += wait
        redraw()
        assert p.redraws == drawn + 1
        now[0] += 4.0  # four drawings' time after the last: drawn at once
        write_metrics(log, rows(1, start=2), mode="a")
        p.update()
        assert p.redraws == drawn + 2 and len(later) == 1
    finally:
        p.close()


def test_the_background_poll_keeps_to_the_same_spacing(tmp_path, monkeypatch):
    """A plot shown before `sft(on_metrics=plot.update)` starts also polls the files in a thread:
    that poll redraws no sooner than `update` would (four drawings' time after a drawing that took
    a second), and draws the final state when the run ends whatever the time."""
    now = slow_drawings(monkeypatch)
    log = tmp_path / "run"
    write_metrics(log, rows(1))
    p = LossPlot(log, refresh_s=3600)
    try:
        drawn = p.redraws
        now[0] += 2.0
        write_metrics(log, rows(1, start=1), mode="a")
        assert p._poll_due() is False and p.redraws == drawn  # changed, but too soon after a slow drawing
        now[0] += 2.0
        assert p._poll_due() is False and p.redraws == drawn + 1 and len(p.frame) == 2
        write_metrics(log, rows(1, start=2), mode="a")
        (log / "checkpoints.jsonl").write_text(json.dumps({"name": "final", "sampler_path": "x"}) + "\n")
        assert p._poll_due() is True and len(p.frame) == 3  # the end is drawn at once
    finally:
        p.close()
