"""Property tests: over 1,000 generated bad inputs thrown at the readers (run files, JSONL event and
tag files, cases files). Each is read or reported (MachineFormatError naming the file, or a warning
listing what was skipped); never a bare traceback, never a silently lost record."""

import json
import tempfile
import warnings
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import machine_nb as mnb
from machine_nb.errors import MachineFormatError
from machine_nb.store.workspace import iter_runs, read_cases

EXAMPLES = 170  # per test; six tests → 1,020 generated inputs, the thousand the module promises
CFG = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

VALID = {"id": "r1", "machine": "m", "workspace": "w", "input": "q", "output": "a", "model": "x", "harness": "tinker",
         "startedAt": "2026-11-02T09:00:00Z", "finishedAt": "2026-11-02T09:00:05Z", "history": [],
         "trajectory": [{"role": "user", "content": "q"},
                        {"role": "assistant", "content": "", "name": "t", "toolCallId": "c", "toolInput": {"a": 1}},
                        {"role": "tool", "content": "Error: x", "name": "t", "toolCallId": "c"},
                        {"role": "assistant", "content": "a", "reasoning": "r"}],
         "scorecard": {"total": 1, "evaluatedAt": "", "rubric": "fp", "criteria": {}},
         "usage": {"inputTokens": 1, "outputTokens": 2, "costUsd": 0.1}, "conversation": {"final": True}}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=8)


def _paths(value, prefix=()):
    """Every (path) into a JSON value, so a mutation can hit any field at any depth."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


PATHS = [p for p in _paths(VALID) if p]


def _mutate(value, path, new, delete):
    value = json.loads(json.dumps(value))
    target = value
    for key in path[:-1]:
        target = target[key]
    if delete and isinstance(target, dict):
        target.pop(path[-1], None)
    else:
        target[path[-1]] = new
    return value


def _load_one(text_or_bytes):
    """Write one run file into a fresh workspace; load it tolerant and strict; check the contract."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ".machine" / "runs" / "m" / "r1.json"
        path.parent.mkdir(parents=True)
        path.write_bytes(text_or_bytes if isinstance(text_or_bytes, bytes) else text_or_bytes.encode())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            df = mnb.load_runs(tmp)
        skipped = [w for w in caught if "skipped 1 run file" in str(w.message)]
        assert len(df) + len(skipped) == 1  # read or reported, never silently lost
        try:
            list(iter_runs(tmp, on_error="raise"))  # load_runs(on_error="raise") minus the DataFrame
            strict_ok = True
        except MachineFormatError as exc:
            strict_ok = False
            assert str(path) in str(exc)
        assert strict_ok == (len(df) == 1)
        if len(df):  # what is accepted also flows through messages, selection and export
            mnb.messages(df)
            mnb.training_lines(mnb.select_runs(df, {"name": "m"}, rubric=None, min_score=-1e308), {"name": "m"})
        return df


@CFG
@given(data=st.binary(max_size=300))
def test_random_bytes_as_run_file(data):
    _load_one(data)


@CFG
@given(path=st.sampled_from(PATHS), new=json_values, delete=st.booleans())
def test_mutated_field_in_run_file(path, new, delete):
    _load_one(json.dumps(_mutate(VALID, path, new, delete)))


@CFG
@given(cut=st.integers(min_value=0, max_value=len(json.dumps(VALID)) - 1), junk=st.binary(max_size=4))
def test_truncated_or_corrupted_run_file(cut, junk):
    raw = json.dumps(VALID).encode()
    _load_one(raw[:cut] + junk)


@CFG
@given(lines=st.lists(st.one_of(st.binary(max_size=40).filter(lambda b: b"\n" not in b and b"\r" not in b),
                                json_values.map(lambda v: json.dumps(v).encode())), max_size=6),
       final_newline=st.booleans())
def test_jsonl_readers_events_and_tag_store(lines, final_newline):
    body = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / ".machine").mkdir()
        (Path(tmp) / ".machine" / "events.jsonl").write_bytes(body)
        (Path(tmp) / "train.jsonl").write_bytes(body)
        nonblank = sum(1 for line in body.split(b"\n") if line.strip())
        for read in (mnb.load_events, mnb.tagged):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                df = read(tmp)
            reported = sum(str(w.message).count("\n  ") for w in caught)
            assert len(df) + reported == nonblank  # each line is a row or listed in the warning


@CFG
@given(value=json_values)
def test_cases_files(value):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cases.json"
        path.write_text(json.dumps(value))
        try:
            cases = read_cases(path)
        except MachineFormatError as exc:
            assert str(path) in str(exc)
        else:
            assert cases and all(isinstance(c["input"], str) for c in cases)


DEFINITION_FILES = ["model.json", "versions.json", "tools.json", "rubric.json", "cases.json", "holdout.json",
                    "instructions.md"]


@CFG
@given(fname=st.sampled_from(DEFINITION_FILES + ["session"]),
       content=st.one_of(st.binary(max_size=60), json_values.map(lambda v: json.dumps(v).encode())))
def test_machine_definitions_and_sessions(fname, content):
    with tempfile.TemporaryDirectory() as tmp:
        if fname == "session":
            path = Path(tmp) / ".machine" / "sessions" / "m" / "s1.json"
            path.parent.mkdir(parents=True)
            path.write_bytes(content)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                df = mnb.load_sessions(tmp)
            assert len(df) + sum("skipped 1 session" in str(w.message) for w in caught) == 1
            return
        d = Path(tmp) / "machines" / "m"
        d.mkdir(parents=True)
        (d / fname).write_bytes(content)
        try:
            mdef = mnb.load_machine(tmp, "m")
        except MachineFormatError as exc:
            assert str(d) in str(exc)
        else:
            assert mdef["name"] == "m" and (mdef["model"] is None or isinstance(mdef["model"], str))
            assert mdef["rubric"] is None or isinstance(mdef["rubric"], str)


def test_the_generated_inputs_number_at_least_a_thousand():
    """Whatever order the tests run in: the Hypothesis tests here ask for 1,000+ inputs together."""
    tests = [f for name, f in globals().items() if name.startswith("test_") and hasattr(f, "hypothesis")]
    assert len(tests) >= 5
    assert sum(f._hypothesis_internal_use_settings.max_examples for f in tests) >= 1000
