"""The tag store: rows exactly as /good, /good --as, /good --trace and /bad write them, /tagged's
view, untag without losing other rows, where the store lives, and concurrent appends."""

import json
import multiprocessing as mp
import os
import re
from pathlib import Path

import pytest

import machine_nb as mnb
from machine_nb.store.tags import TAGGED_COLUMNS, project_key

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_workspace"


@pytest.fixture(scope="module")
def runs():
    return mnb.load_runs(SAMPLE)


def lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_good_row_like_slash_good(tmp_path, runs):
    row = runs[runs["machine"] == "support"].iloc[0]
    out = mnb.tag(row, "good", note="nice", store=tmp_path)
    assert re.fullmatch(r"[0-9a-f]{12}", out["id"])
    assert lines(tmp_path / "train.jsonl") == [out]
    assert out["messages"] == [{"role": "user", "content": row["input"]}, {"role": "assistant", "content": row["output"]}]
    assert (out["tag"], out["kind"], out["note"], out["source"], out["run"], out["machine"]) == (
        "good", "final", "nice", f"{row['id']}.json", row["id"], "support")


def test_rewrite_bad_observed_and_message_lists(tmp_path, runs):
    run = runs[runs["machine"] == "support"].iloc[1]["run"]  # a Run dict
    rw = mnb.tag(run, "good", note="kept", rewrite="The exact answer.", store=tmp_path)
    assert rw["messages"][1] == {"role": "assistant", "content": "The exact answer."} and rw["note"] == "kept"
    assert rw["rewritten"] is True
    bad = mnb.tag(run, "bad", store=tmp_path)
    assert lines(tmp_path / "rejected.jsonl") == [bad] and "note" not in bad
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "first"},
            {"role": "user", "content": "  q2 "}, {"role": "assistant", "content": [{"type": "text", "text": "a2"}]}]
    obs = mnb.tag(msgs, "observed", store=tmp_path)
    assert obs["messages"] == [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    assert "source" not in obs and lines(tmp_path / "observed.jsonl") == [obs]
    with pytest.raises(ValueError, match="no assistant reply"):
        mnb.tag([{"role": "user", "content": "q"}], store=tmp_path)
    with pytest.raises(ValueError, match="tag must be"):
        mnb.tag(msgs, "great", store=tmp_path)
    with pytest.raises(ValueError, match="cannot be combined"):
        mnb.tag(msgs, rewrite="x", trace=True, store=tmp_path)


def test_trace_row(tmp_path, runs):
    run = runs[(runs["machine"] == "coder") & (runs["n_failed_tool_calls"] > 0)].iloc[0]
    row = mnb.tag(run, "good", trace=True, store=tmp_path)
    assert lines(tmp_path / "traces.jsonl") == [row] and row["kind"] == "trace"
    msgs = row["messages"]
    assert msgs[0]["role"] == "user" and msgs[-1]["role"] == "assistant"
    assert all(isinstance(m["content"], str) for m in msgs)  # reasoning omitted by default
    calls = {tc["id"] for m in msgs for tc in m.get("tool_calls", [])}
    assert calls and calls == {m["tool_call_id"] for m in msgs if m["role"] == "tool"}
    roles = {r["role"] for r in row["trajectory"]}
    assert roles == {"user", "assistant", "tool"} and all("timestamp" in r for r in row["trajectory"])
    call_rec = next(r for r in row["trajectory"] if r.get("tool_calls"))
    assert call_rec["content"] is None and set(call_rec["tool_calls"][0]) == {"id", "name", "args"}
    with_r = mnb.tag(run, "good", trace=True, reasoning=True, store=tmp_path)
    assert any(r["role"] == "reasoning" for r in with_r["trajectory"])


def test_tagged_and_untag(tmp_path, runs):
    support = runs[runs["machine"] == "support"]
    rows = [mnb.tag(support.iloc[i], "good", store=tmp_path) for i in range(3)]
    mnb.tag(support.iloc[3], "bad", note="no", store=tmp_path)
    with open(tmp_path / "train.jsonl", "ab") as fh:
        fh.write(b'{"broken\n')  # a bad line: kept by untag, skipped (with a warning) by tagged
    with pytest.warns(UserWarning, match=r"train.jsonl:4"):
        df = mnb.tagged(tmp_path)
    assert list(df.columns) == TAGGED_COLUMNS
    assert list(df["file"]) == ["train.jsonl"] * 3 + ["rejected.jsonl"]
    assert list(df["tag"]) == ["good"] * 3 + ["bad"] and df.iloc[3]["note"] == "no"
    assert df.iloc[0]["last_user"] == support.iloc[0]["input"] and (df["n_messages"] == 2).all()
    removed = mnb.untag(rows[1]["id"], store=tmp_path)
    assert removed == rows[1]
    body = (tmp_path / "train.jsonl").read_bytes()
    assert body.count(b"\n") == 3 and b'{"broken\n' in body
    assert [r["id"] for r in lines_ok(tmp_path / "train.jsonl")] == [rows[0]["id"], rows[2]["id"]]
    with pytest.raises(KeyError):
        mnb.untag(rows[1]["id"], store=tmp_path)


def lines_ok(path):
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def test_store_dir(tmp_path, monkeypatch):
    a, b = tmp_path / "one" / "Example Project", tmp_path / "two" / "Example Project"
    a.mkdir(parents=True), b.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(a)
    monkeypatch.delenv("MACHINE_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert mnb.store_dir(a).parent == tmp_path / "home" / ".machine"
    assert re.fullmatch(r"example-project-[0-9a-f]{12}", project_key(a))
    assert project_key(a) != project_key(b)  # same name, different parents
    assert project_key(link) == project_key(a)  # a symlinked path maps to one store
    monkeypatch.setenv("MACHINE_DATA_DIR", "data-dir")
    assert mnb.store_dir(a) == (a / "data-dir").resolve() / project_key(a)
    monkeypatch.setenv("MACHINE_DATA_DIR", "  ")
    assert mnb.store_dir(a).parent == tmp_path / "home" / ".machine"
    monkeypatch.chdir(a)
    monkeypatch.setenv("MACHINE_DATA_DIR", str(tmp_path / "abs"))
    row = mnb.tag([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    assert lines(tmp_path / "abs" / project_key(a) / "train.jsonl") == [row]


def _writer(args):
    store, k, n = args
    for i in range(n):
        mnb.tag([{"role": "user", "content": f"w{k} q{i}"}, {"role": "assistant", "content": "x" * 3000}], store=store)
    return n


def test_concurrent_tagging_loses_nothing(tmp_path):
    with mp.get_context("fork").Pool(4) as pool:
        assert sum(pool.map(_writer, [(str(tmp_path), k, 50) for k in range(4)])) == 200
    rows = lines(tmp_path / "train.jsonl")  # every line parses: none interleaved or half-written
    assert len(rows) == 200 and len({r["id"] for r in rows}) == 200
    assert sorted(r["messages"][0]["content"] for r in rows) == sorted(f"w{k} q{i}" for k in range(4) for i in range(50))
    assert os.stat(tmp_path / "train.jsonl").st_mode & 0o777 == 0o600


def _two_machines_same_id(tmp_path):
    """A workspace where machines `a` and `b` each have a run with id `r1` (ids are unique per machine only)."""
    ws = tmp_path / "ws"
    for machine in ("a", "b"):
        d = ws / ".machine" / "runs" / machine
        d.mkdir(parents=True)
        (d / "r1.json").write_text(json.dumps({
            "id": "r1", "machine": machine, "input": f"q {machine}", "output": f"a {machine}",
            "startedAt": "2026-11-02T09:00:00Z",
            "trajectory": [{"role": "user", "content": f"q {machine}"}, {"role": "assistant", "content": f"a {machine}"}]}))
    return ws


def test_tags_are_keyed_by_machine_and_id(tmp_path):
    ws = _two_machines_same_id(tmp_path)
    store = tmp_path / "store"
    runs = mnb.load_runs(ws)
    mnb.tag(runs[runs["machine"] == "a"].iloc[0], "good", store=store)
    tagged = mnb.load_runs(ws, store=store).set_index("machine")
    assert tagged.loc["a", "tags"] == ["good"] and tagged.loc["b", "tags"] == []
    assert list(mnb.tagged(store)[["machine", "run"]].iloc[0]) == ["a", "r1"]


def test_rows_without_machine_match_an_id_only_when_it_is_unambiguous(tmp_path):
    ws = _two_machines_same_id(tmp_path)
    store = tmp_path / "store"
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    mnb.tag(msgs, "good", store=store, source="r1.json")  # as Machine writes it: no machine, no run
    with pytest.warns(UserWarning, match=r"(?s)r1.*machines a, b"):
        both = mnb.load_runs(ws, store=store)
    assert all(t == [] for t in both["tags"])  # never on the wrong run
    alone = mnb.load_runs(ws, "b", store=store)  # one run with that id among those loaded
    assert list(alone["tags"]) == [["good"]]


def test_tagged_says_when_the_store_is_missing_or_not_a_folder(tmp_path, capsys):
    from machine_nb.cli import main
    from machine_nb.errors import MachineFormatError

    with pytest.warns(UserWarning, match="no tag store"):
        assert len(mnb.tagged(tmp_path / "nowhere")) == 0
    (tmp_path / "file").write_text("x")
    with pytest.raises(MachineFormatError, match="not a folder"):
        mnb.tagged(tmp_path / "file")
    assert main(["tagged", "--store", str(tmp_path / "nowhere")]) == 1
    assert "no tag store" in capsys.readouterr().err
    assert main(["tagged", "--store", str(tmp_path / "file")]) == 1
    assert "not a folder" in capsys.readouterr().err


def test_untag_names_a_line_nested_too_deep(tmp_path):
    from machine_nb.errors import MachineFormatError

    row = mnb.tag([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], store=tmp_path, id="abc123")
    deep = '{"id": "deep", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    with open(tmp_path / "train.jsonl", "a") as fh:
        fh.write(deep)
    assert mnb.untag("abc123", store=tmp_path) == row  # the deep line is kept byte for byte
    assert (tmp_path / "train.jsonl").read_text() == deep
    with pytest.raises(MachineFormatError, match=r"train.jsonl:1.*nested") as exc:
        mnb.untag("deep", store=tmp_path)
    assert exc.value.line == 1


def test_untag_removes_what_an_untag_killed_midway_left_and_nothing_else(tmp_path):
    """An untag killed while it rewrites a store file leaves that file's temporary copy (as big as
    the file); the next untag of that file, under the lock every writer holds, removes it. A
    hidden file of the user's beside it stays."""
    import tempfile

    rows = [mnb.tag([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}], store=tmp_path)
            for i in range(2)]
    fd, stale = tempfile.mkstemp(dir=tmp_path, prefix=".train.jsonl.", suffix=".tmp")  # as atomic_replace names it
    os.write(fd, (tmp_path / "train.jsonl").read_bytes())
    os.close(fd)
    (tmp_path / ".train.jsonl.mine").write_text("mine")
    assert mnb.untag(rows[0]["id"], store=tmp_path) == rows[0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".train")) == [
        ".train.jsonl.lock", ".train.jsonl.mine"]
    assert [r["id"] for r in lines_ok(tmp_path / "train.jsonl")] == [rows[1]["id"]]


def test_tagged_and_untag_stream_a_big_store(tmp_path):
    """Memory held by tagged() + untag() grows with the rows' summaries (the last user and assistant
    texts), not with whole rows: here each row's bulk is a long tool result, as in a trace.
    Measured in a fresh process (tracemalloc beside the local server's threads risks a crash)."""
    import subprocess
    import sys

    code = """
import json, sys, tracemalloc
from pathlib import Path
import machine_nb as mnb
tmp = Path(sys.argv[1])
line = {"id": None, "messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "x" * 4000},
                                 {"role": "assistant", "content": "done"}], "tag": "good", "kind": "trace"}
def peak(n):
    store = tmp / f"s{n}"
    store.mkdir()
    with open(store / "train.jsonl", "w") as fh:
        for i in range(n):
            fh.write(json.dumps({**line, "id": f"id{i}"}) + "\\n")
    tracemalloc.start()
    df = mnb.tagged(store)
    mnb.untag(f"id{n // 2}", store=store)
    _, top = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(df) == n and len(mnb.tagged(store)) == n - 1
    return top
peak(10)  # imports and first-call set-up out of the way
print(json.dumps([peak(500), peak(5000)]))
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    small, big = json.loads(out.stdout.strip().splitlines()[-1])
    assert big < 3 * small  # ten times the rows, far less than ten times the memory


def test_the_lazy_row_column_maps_like_plain_records(tmp_path):
    """tagged()'s `row` column reads rows on demand; `.map` must still give plain values (a
    boolean mask filters the frame, as notebooks do)."""
    import machine_nb as mnb

    store = tmp_path / "store"
    for i in range(3):
        mnb.tag({"trajectory": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}],
                 "history": [], "id": f"r{i}", "machine": "m" if i else "other"}, "good", store=store)
    tags = mnb.tagged(store=store)
    mask = tags["row"].map(lambda r: r.get("machine") == "m")
    assert str(mask.dtype) in ("bool", "boolean") and len(tags[mask]) == 2


def test_a_rewrite_row_keeps_the_reply_it_replaced(tmp_path):
    """`/good --as` rows keep what the model said, so a preference pair can set the rewrite against it."""
    import machine_nb as mnb

    run = {"id": "r1", "machine": "m", "history": [],
           "trajectory": [{"role": "user", "content": "What is 2 plus 2?"}, {"role": "assistant", "content": "2 + 2 = 4"}]}
    row = mnb.tag(run, "good", rewrite="answer: 4", store=tmp_path)
    assert row["rewritten"] and row["replaced"] == "2 + 2 = 4" and row["messages"][-1]["content"] == "answer: 4"
    pairs = mnb.preference_pairs(store=tmp_path)
    assert pairs["rejected"].iloc[0] == [{"role": "assistant", "content": "2 + 2 = 4"}]
    assert pairs["chosen"].iloc[0] == [{"role": "assistant", "content": "answer: 4"}]
    assert "replaced" not in mnb.tag(run, "good", store=tmp_path)


def test_a_rewrite_of_an_unanswered_turn_replaces_nothing_and_replaced_can_be_given(tmp_path):
    """A turn with no reply yet can still be tagged with a rewrite (the answer the model should
    give): the row has no `replaced` key, so no preference pair rejects a reply that was never
    given. A caller that knows the reply set aside passes it as `replaced=`."""
    import machine_nb as mnb

    asked = {"id": "r2", "machine": "m", "history": [],
             "trajectory": [{"role": "user", "content": "What is 2 plus 3?"}]}
    row = mnb.tag(asked, "good", rewrite="answer: 5", store=tmp_path, id="u1")
    assert row["messages"] == [{"role": "user", "content": "What is 2 plus 3?"},
                               {"role": "assistant", "content": "answer: 5"}]
    assert row["rewritten"] is True and "replaced" not in row and row["run"] == "r2"
    assert [r["id"] for r in mnb.read_jsonl(tmp_path / "train.jsonl")] == ["u1"]
    with pytest.raises(ValueError, match="no assistant reply"):
        mnb.tag(asked, "good", store=tmp_path)  # nothing to tag without a rewrite
    given = mnb.tag(asked, "good", rewrite="answer: 5", replaced="5, I think", store=tmp_path)
    assert given["replaced"] == "5, I think"
    with pytest.raises(ValueError, match="replaced="):
        mnb.tag(asked, "good", replaced="x", store=tmp_path)


@pytest.mark.parametrize("rewrite", ["", "   ", "\n\t"])
def test_an_empty_or_whitespace_rewrite_is_refused_and_nothing_is_written(tmp_path, runs, rewrite):
    run = runs[runs["machine"] == "support"].iloc[0]
    with pytest.raises(ValueError, match="rewrite= is (empty|only whitespace)"):
        mnb.tag(run, "good", rewrite=rewrite, store=tmp_path)
    assert not (tmp_path / "train.jsonl").exists()
