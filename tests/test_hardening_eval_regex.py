"""A pathological regex in an eval row (`"match": "regex"` or `"format"`) or in probe(format=…) never
hangs the eval: the match is bounded in time, and a row past the bound counts wrong, says why in its
`error`, and is warned about; the other rows score as usual.

The replies below make Python's `re` backtrack for hours, so the scenarios run in one child process
(started once for the module) that the tests give up on after 10 minutes (a hang guard, not a speed
measurement). The child sets the bound users set, `patterns.REGEX_TIMEOUT_S`, to BOUND_S: every match
it bounds would run for hours, and every match it lets through ends in microseconds."""

import json
import subprocess
import sys
import textwrap

import pytest

from machine_nb.core.chat import check_row
from machine_nb.errors import MachineFormatError
from machine_nb.evaluation.scoring import format_matches, score_output

EVIL = "(a|aa)+$"  # exponential for a backtracking engine on "aaaa…a!"
REPLY = "a" * 200 + "!"
BOUND_S = 0.1

PRELUDE = textwrap.dedent("""
    import asyncio, json, sys, warnings
    import numpy as np
    import tinker
    from machine_nb.checks.render import get_renderer
    from machine_nb.core import patterns

    MODEL = "local/arith-tiny"
    renderer = get_renderer(MODEL)

    class Fixed:
        '''A stand-in sampler with tinker's API that always replies `text`, rendered as the model emits it.'''
        def __init__(self, text):
            self.text = text
        async def sample_async(self, prompt, num_samples, sampling_params):
            full, _ = renderer.build_supervised_example([{"role": "user", "content": "q"},
                                                         {"role": "assistant", "content": self.text}])
            head = renderer.build_generation_prompt([{"role": "user", "content": "q"}]).length
            tokens = full.to_ints()[head:]
            seq = tinker.SampledSequence(stop_reason="stop", sequence_id="0", tokens_np=np.array(tokens, dtype=np.int32))
            return tinker.SampleResponse(sequences=[seq])
""")


SCENARIOS = {
    "score_and_format": f"""
        from machine_nb.evaluation.scoring import score_output, format_matches
        from machine_nb.core.patterns import RegexTimeout
        seen = {{}}
        for name, call in (("score", lambda: score_output({REPLY!r}, {EVIL!r}, "regex")),
                           ("format", lambda: format_matches({REPLY!r}, {EVIL!r}))):
            try:
                seen[name] = repr(call())
            except RegexTimeout as exc:
                seen[name] = "timeout: " + str(exc)
        seen["nested_plus"] = score_output("a" * 40 + "!", "(a+)+$", "regex")
        OUT["score_and_format"] = seen
    """,
    "evaluate": f"""
        from machine_nb.evaluation.evaluate import evaluate
        rows = [
            {{"messages": [{{"role": "user", "content": "q1"}}], "expected": {EVIL!r}, "match": "regex"}},
            {{"messages": [{{"role": "user", "content": "q2"}}], "expected": "a+!", "match": "regex"}},
            {{"messages": [{{"role": "user", "content": "q3"}}], "expected": "a+!", "match": "regex", "format": {EVIL!r}}},
        ]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = evaluate(rows, MODEL, engine="local", sampling_client=Fixed({REPLY!r}), save=False)
        df = res.rows
        OUT["evaluate"] = {{"correct": df["correct"].tolist(), "format_ok": df["format_ok"].tolist(),
                            "error": df["error"].tolist(), "summary": res.summary,
                            "warnings": [str(w.message) for w in caught]}}
    """,
    "probe": f"""
        from machine_nb.evaluation.evaluate import probe
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            df = probe(["q1", "q2"], MODEL, engine="local", format={EVIL!r},
                       baseline_client=Fixed("fine"), checkpoint_client=Fixed({REPLY!r})).rows
        OUT["probe"] = {{"bled": df["bled"].tolist(), "error": df["error"].tolist(),
                         "warnings": [str(w.message) for w in caught]}}
    """,
}


@pytest.fixture(scope="module")
def outcomes() -> dict:
    """Every scenario, run in one child: scenario name -> what it recorded in OUT."""
    code = PRELUDE + f"patterns.REGEX_TIMEOUT_S = {BOUND_S}\nOUT = {{}}\n" \
        + "".join(textwrap.dedent(body) for body in SCENARIOS.values()) + "print(json.dumps(OUT, default=str))\n"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                              env={**__import__("os").environ, "MACHINE_NB_PROGRESS": "0"})
    except subprocess.TimeoutExpired:
        pytest.fail("the regex match hung (no result after 10 minutes)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_score_output_and_format_matches_raise_a_regex_timeout(outcomes):
    out = outcomes["score_and_format"]
    assert out["score"].startswith("timeout: ") and "(a|aa)+$" in out["score"]
    assert f"ran past its {BOUND_S:g} s bound" in out["score"]
    assert out["format"].startswith("timeout: ")
    assert out["nested_plus"] is False  # `(a+)+$` on a short reply answers at once: no match


def test_evaluate_counts_a_timed_out_row_wrong_and_says_why(outcomes):
    out = outcomes["evaluate"]
    assert out["correct"] == [False, True, True]
    assert out["format_ok"] == [None, None, False]
    assert "timed out" in out["error"][0] and "match 'regex'" in out["error"][0]
    assert not isinstance(out["error"][1], str) and "timed out" in out["error"][2] and "format" in out["error"][2]
    assert out["summary"]["regex_timeouts"] == 2 and out["summary"]["errors"] == 0
    assert out["summary"]["accuracy"] == pytest.approx(2 / 3)
    said = "\n".join(out["warnings"])
    assert "2 of 3" in said and "row 0" in said and "row 2" in said


def test_probe_format_timeout_is_recorded_not_hung(outcomes):
    out = outcomes["probe"]
    assert out["bled"] == [None, None]
    assert all("timed out" in e for e in out["error"])
    assert any("timed out" in w for w in out["warnings"])


def test_valid_patterns_score_as_regexes():
    assert score_output("answer: 62", r"answer: -?\d+", "regex")
    assert score_output("  Answer: 62\n", r"(?i)answer: 62", "regex")
    assert score_output("line one\nline two", r"line one.line two", "regex")  # DOTALL: "." matches a newline
    assert not score_output("answer: 62 and more", r"answer: \d+", "regex")  # fullmatch
    assert format_matches("answer: -3", r"^answer: -?\d+$") is True and format_matches("x", None) is None


def test_invalid_patterns_are_refused_before_sampling():
    with pytest.raises(MachineFormatError, match="expected"):
        check_row({"messages": [{"role": "user", "content": "q"}], "expected": "(", "match": "regex"}, line=1)
    with pytest.raises(MachineFormatError, match="format"):
        check_row({"messages": [{"role": "user", "content": "q"}], "expected": "a", "format": "["}, line=1)
    from machine_nb.evaluation.evaluate import probe

    with pytest.raises(ValueError, match="format"):
        probe(["q"], "thinkingmachines/Inkling-Small", engine="tinker", format="(",
              baseline_client=object(), checkpoint_client=object())
