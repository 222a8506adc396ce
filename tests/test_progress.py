"""The progress bar: counts, postfix and a closed state, in a terminal or disabled."""

from machine_nb.progress import progress


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


def test_terminal_mode_writes_to_stderr(capsys):
    with progress(total=2, desc="eval", enabled=True) as bar:
        bar.update(2)
    assert "eval" in capsys.readouterr().err
