"""The progress bar: counts, postfix and a closed state, in a terminal or disabled."""

from machine_nb.core.progress import progress


def test_counts_and_postfix_text():
    bar = progress(total=3, desc="sft", unit="steps", enabled=False)
    bar.update(loss=1.23456)
    bar.update(2)
    bar.close()
    text = bar.text()
    assert text.startswith("sft: 3/3 steps") and "loss 1.235" in text


def test_wraps_iterables_and_closes():
    bar = progress(range(5), desc="rows", enabled=False)
    seen = list(bar)
    assert seen == [0, 1, 2, 3, 4]
    assert bar.n == 5 and bar.closed  # iterating to the end closes the bar


def test_a_loop_left_early_closes_the_bar():
    """A `break` (or an error) out of a loop over the bar closes it, as a finished loop does: the
    notebook's line does not stay at its last throttled count."""
    bar = progress(range(5), desc="rows", enabled=False)
    for i in bar:
        if i == 2:
            break
    assert bar.closed and bar.n == 2


def test_terminal_mode_writes_to_stderr(capsys):
    with progress(total=2, desc="eval", enabled=True) as bar:
        bar.update(2)
    assert "eval" in capsys.readouterr().err


def test_one_rule_decides_whether_a_bar_shows(monkeypatch):
    """`progress=True/False` decides; None is on unless MACHINE_NB_PROGRESS=0 (and off for work
    too small to need a bar)."""
    from machine_nb.core.progress import resolve_progress

    monkeypatch.delenv("MACHINE_NB_PROGRESS", raising=False)
    assert (resolve_progress(None), resolve_progress(True), resolve_progress(False)) == (True, True, False)
    assert resolve_progress(None, worth_a_bar=False) is False and resolve_progress(True, worth_a_bar=False) is True
    monkeypatch.setenv("MACHINE_NB_PROGRESS", "0")
    assert (resolve_progress(None), resolve_progress(True), resolve_progress(False)) == (False, True, False)
    assert progress(total=1, enabled=None)._mode == "off" and progress(total=1, enabled=True)._mode == "tqdm"


def test_an_explicit_progress_true_shows_the_bar_whatever_the_environment(tmp_path, monkeypatch, capsys):
    import json

    from machine_nb.checks.tokens import count_tokens
    from machine_nb.checks.validate import validate

    monkeypatch.setenv("MACHINE_NB_PROGRESS", "0")
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": "a"}]}) + "\n")
    count_tokens(path, "local/arith-tiny", progress=True)
    validate(path, progress=True)
    err = capsys.readouterr().err
    assert "tokens local/arith-tiny" in err and "validate train.jsonl" in err
    count_tokens(path, "local/arith-tiny")
    validate(path)
    assert capsys.readouterr().err == ""  # a small file, and the environment says no
