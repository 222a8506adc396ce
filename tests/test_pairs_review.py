"""Preference pairs at their edges, as a user meets them: a rewrite tagged mid-session whose
session went on is still paired; replies that differ only in spacing or Unicode form are one reply
(no duplicate, no hidden contradiction, no invisible preference); a damaged tag row is skipped and
counted, not a traceback; an eval row with no prompt text is refused, not paired as "None"; pairs
written from a hand-edited frame are checked as the reader checks them, carry ids that match
their content, and read back; TRL's implicit-prompt files read."""

from __future__ import annotations

import json
import unicodedata
import warnings

import pandas as pd
import pytest

import machine_nb as mnb
from machine_nb.errors import MachineFormatError
from machine_nb.store.pairs import pair_id
from machine_nb.training.pairs import (CONTRADICTS, DUPLICATE, IDENTICAL, PairsSkipped, preference_pairs, read_pairs,
                                       write_pairs)

SYSTEM = "You are a tutor."
MACHINE = {"name": None, "instructions": SYSTEM}


def msg(role: str, content: str) -> dict:
    return {"role": role, "content": content}


def texts(pairs) -> list[tuple[str, str, str]]:
    return [(p["input"], p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in pairs.to_dict("records")]


def session(rid: str, *turns: tuple[str, str]) -> dict:
    """A Run dict whose trajectory holds the turns (user, reply) in order."""
    traj = [m for q, a in turns for m in (msg("user", q), msg("assistant", a))]
    return {"id": rid, "machine": "tutor", "input": turns[0][0], "trajectory": traj, "instructions": SYSTEM,
            "startedAt": "2026-11-01T18:00:00.000Z"}


def machine_row(rid: str, tag_id: str, question: str, rewrite: str) -> dict:
    """A /good --as row as Machine writes it: no `replaced` key, the session file as its source."""
    return {"id": tag_id, "tag": "good", "kind": "final", "rewritten": True, "source": f"{rid}.json",
            "messages": [msg("user", question), msg("assistant", rewrite)]}


# --------------------------------------------------------------------------- rewrites rebuilt from runs


def test_a_rewrite_tagged_mid_session_is_paired_after_the_session_went_on():
    """Machine tags the latest turn; the session file then grows with later turns. The tagged turn
    is still in it, so the reply it replaced is read from that turn, not from the newest one."""
    run = session("s1", ("Compute 10 + 29.", "10 + 29 = 39."), ("And 3 + 4?", "3 + 4 = 7."))
    row = machine_row("s1", "t1", "Compute 10 + 29.", "answer: 39")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PairsSkipped)
        pairs = preference_pairs([row], [run], machine=MACHINE, exclude=[], sources=["rewrite"])
    assert texts(pairs) == [("Compute 10 + 29.", "answer: 39", "10 + 29 = 39.")]
    assert pairs.iloc[0]["prompt"] == [msg("system", SYSTEM), msg("user", "Compute 10 + 29.")]
    # the same question asked twice: the latest asking is the one a later tag could name
    twice = session("s2", ("Compute 1 + 1.", "1 + 1 = 3."), ("Try again.", "Sorry."), ("Compute 1 + 1.", "1 + 1 = 2."),
                    ("Thanks", "You're welcome."))
    pairs = preference_pairs([machine_row("s2", "t2", "Compute 1 + 1.", "answer: 2")], [twice], machine=MACHINE,
                             exclude=[], sources=["rewrite"])
    assert texts(pairs) == [("Compute 1 + 1.", "answer: 2", "1 + 1 = 2.")]


def test_a_rewrite_of_a_turn_that_had_no_reply_is_skipped_without_blaming_the_workspace():
    """/good --as on a turn with no reply yet replaced nothing: there is no rejected reply to find,
    and the run it names is right there, so the warning about missing runs does not apply."""
    run = {"id": "s3", "machine": "tutor", "input": "Compute 2 + 2.", "instructions": SYSTEM,
           "trajectory": [msg("user", "Compute 2 + 2.")]}
    row = machine_row("s3", "t3", "Compute 2 + 2.", "answer: 4")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PairsSkipped)
        pairs = preference_pairs([row], [run], machine=MACHINE, exclude=[], sources=["rewrite"])
    assert len(pairs) == 0
    [skip] = pairs.skipped
    assert skip["id"] == "t3" and "no reply" in skip["reason"] and "no longer holds" not in skip["reason"]


# --------------------------------------------------------------------------- the same reply, written differently


def test_replies_differing_only_in_surrounding_spaces_or_unicode_form_are_one_reply():
    q = "Wie heißt die Hauptstadt?"
    nfc, nfd = unicodedata.normalize("NFC", "Zürich"), unicodedata.normalize("NFD", "Zürich")
    assert nfc != nfd
    rows = [
        {"id": "g1", "tag": "good", "messages": [msg("user", q), msg("assistant", "Bern")]},
        {"id": "b1", "tag": "bad", "messages": [msg("user", q), msg("assistant", nfc)]},
        # the same preference again, the reply with a trailing newline: a duplicate, not a second pair
        {"id": "g2", "tag": "good", "messages": [msg("user", q), msg("assistant", "Bern\n")]},
        # a good reply that looks exactly like the bad one: no preference to learn
        {"id": "g3", "tag": "good", "messages": [msg("user", q), msg("assistant", nfd)]},
    ]
    pairs = preference_pairs(rows, machine=MACHINE, exclude=[], sources=["tags"])
    assert texts(pairs) == [(q, "Bern", nfc)]
    assert pairs.skipped_counts().to_dict() == {DUPLICATE: 1, IDENTICAL: 1}


def test_a_contradiction_hidden_by_a_trailing_space_drops_both_pairs():
    q = "Compute 2 + 2."
    rows = [{"id": "g", "tag": "good", "messages": [msg("user", q), msg("assistant", "answer: 4")]},
            {"id": "b", "tag": "bad", "messages": [msg("user", q), msg("assistant", "2 + 2 = 4.")]},
            {"id": "g2", "tag": "good", "messages": [msg("user", q), msg("assistant", "2 + 2 = 4. ")]},
            {"id": "b2", "tag": "bad", "messages": [msg("user", q), msg("assistant", "answer: 4")]}]
    pairs = preference_pairs(rows, machine=MACHINE, exclude=[], sources=["tags"])
    assert len(pairs) == 0 and pairs.skipped_counts().to_dict() == {CONTRADICTS: 2, IDENTICAL: 2}


def test_a_pairs_file_whose_replies_differ_only_in_unicode_form_is_refused(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": [msg("user", "Where?")],
                                "chosen": [msg("assistant", unicodedata.normalize("NFC", "Zürich"))],
                                "rejected": [msg("assistant", unicodedata.normalize("NFD", "Zürich"))]}) + "\n",
                    encoding="utf-8")
    with pytest.raises(MachineFormatError, match="the same reply") as err:
        read_pairs(path)
    assert err.value.line == 1 and err.value.path == str(path)


# --------------------------------------------------------------------------- damaged inputs


def test_a_tag_row_with_a_message_that_is_not_an_object_is_skipped_and_counted():
    q = "Compute 3 + 3."
    rows = [{"id": "g", "tag": "good", "messages": ["hello", msg("user", q), msg("assistant", "answer: 6")]},
            {"id": "b", "tag": "bad", "messages": [msg("user", q), msg("assistant", "3 + 3 = 7.")]},
            {"id": "g2", "tag": "good", "messages": [msg("user", q), msg("assistant", "answer: 6")]}]
    pairs = preference_pairs(rows, machine=MACHINE, exclude=[], sources=["rewrite", "tags"])
    assert texts(pairs) == [(q, "answer: 6", "3 + 3 = 7.")]
    assert [(s["id"], s["reason"]) for s in pairs.skipped] == [("g", "a message that is not an object")]


def test_an_eval_row_with_no_prompt_text_is_refused_not_paired_as_none():
    rows = pd.DataFrame([{"expected": "answer: 4", "match": "exact", "output": "5", "correct": False, "error": None}])
    with pytest.raises(MachineFormatError, match="no prompt") as err:
        mnb.pairs_from_results(rows)
    assert err.value.field == "rows.0.input"
    rows["input"], rows["prompt"] = [float("nan")], ["Compute 2 + 2."]  # a NaN input falls back to the prompt
    assert texts(mnb.pairs_from_results(rows)) == [("Compute 2 + 2.", "answer: 4", "5")]


# --------------------------------------------------------------------------- files


def good_record(**over) -> dict:
    rec = {"prompt": [msg("user", "q")], "chosen": [msg("assistant", "a")], "rejected": [msg("assistant", "b")]}
    return {**rec, **over}


@pytest.mark.parametrize("record, field, message", [
    (good_record(chosen="a"), "chosen", "list of chat messages"),                     # TRL's text format
    (good_record(prompt="q"), "prompt", "list of chat messages"),
    (good_record(rejected=[msg("assistant", " a ")]), "chosen", "the same reply"),
    (good_record(chosen=[msg("user", "a")]), "chosen", "assistant reply"),
])
def test_write_pairs_refuses_what_its_reader_would_refuse_and_writes_nothing(tmp_path, record, field, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text("kept\n")
    with pytest.raises(MachineFormatError, match=message) as err:
        write_pairs([good_record(), record], path)
    assert err.value.line == 2 and err.value.field == field
    assert path.read_text() == "kept\n"


def test_pairs_written_from_an_edited_frame_carry_ids_of_their_content_and_read_back(tmp_path):
    rows = [{"id": "g", "tag": "good", "messages": [msg("user", "Compute 5 + 5."), msg("assistant", "answer: 10")]},
            {"id": "b", "tag": "bad", "messages": [msg("user", "Compute 5 + 5."), msg("assistant", "5 + 5 = 11.")]}]
    pairs = preference_pairs(rows, machine=MACHINE, exclude=[], sources=["tags"])
    pairs.at[0, "chosen"] = [msg("assistant", "answer: 10.")]  # a notebook edit of the chosen reply
    pairs["machine"] = float("nan")  # a column pandas filled in (a concat, a Parquet round trip)
    for fmt in ("comparison", "trl"):
        path = write_pairs(pairs, tmp_path / f"{fmt}.jsonl", format=fmt)
        line = json.loads(path.read_text().splitlines()[0])
        back = read_pairs(path)
        expected = pair_id(pairs.iloc[0]["prompt"], [msg("assistant", "answer: 10.")], pairs.iloc[0]["rejected"])
        assert line["pair"] == back.iloc[0]["pair"] == expected and "machine" not in line
        assert texts(back) == [("Compute 5 + 5.", "answer: 10.", "5 + 5 = 11.")]


def test_a_trl_file_with_an_implicit_prompt_reads_its_shared_start_as_the_prompt(tmp_path):
    """TRL's implicit-prompt preference rows hold two whole conversations and no `prompt`."""
    path = tmp_path / "implicit.jsonl"
    start = [msg("system", SYSTEM), msg("user", "Compute 8 + 8.")]
    path.write_text(json.dumps({"chosen": start + [msg("assistant", "answer: 16")],
                                "rejected": start + [msg("assistant", "8 + 8 = 17.")]}) + "\n")
    back = read_pairs(path)
    assert texts(back) == [("Compute 8 + 8.", "answer: 16", "8 + 8 = 17.")] and back.iloc[0]["prompt"] == start
    path.write_text(json.dumps({"chosen": [msg("user", "a?"), msg("assistant", "x")],
                                "rejected": [msg("user", "b?"), msg("assistant", "y")]}) + "\n")
    with pytest.raises(MachineFormatError, match="start with the same prompt") as err:
        read_pairs(path)
    assert err.value.line == 1 and err.value.field == "rejected"


def test_a_pairs_frame_read_back_from_parquet_writes_the_same_file(tmp_path):
    """pyarrow gives message lists back as numpy arrays, and every message every key some message has."""
    rows = [{"id": "g", "tag": "good", "messages": [msg("user", "Compute 5 + 5."), msg("assistant", "answer: 10")]},
            {"id": "b", "tag": "bad", "messages": [msg("user", "Compute 5 + 5."), msg("assistant", "5 + 5 = 11.")]}]
    pairs = preference_pairs(rows, machine=MACHINE, exclude=[], sources=["tags"])
    pairs = pd.DataFrame(pairs)
    pairs.to_parquet(tmp_path / "pairs.parquet")
    again = pd.read_parquet(tmp_path / "pairs.parquet")
    assert type(again.iloc[0]["chosen"]).__module__ == "numpy"
    first = write_pairs(pairs, tmp_path / "first.jsonl").read_text()
    assert write_pairs(again, tmp_path / "again.jsonl").read_text() == first


def test_a_pair_whose_prompt_has_no_text_is_refused_by_its_reader_and_writer_and_never_built(tmp_path):
    """DPO refuses a pair with no prompt text; the file it would come from is refused when read or
    written, and tag rows with nothing before the reply give no such pair."""
    record = good_record(prompt=[msg("system", " ")])
    with pytest.raises(MachineFormatError, match="no text") as err:
        write_pairs([record], tmp_path / "pairs.jsonl")
    assert err.value.field == "prompt" and not (tmp_path / "pairs.jsonl").exists()
    path = tmp_path / "hand.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(MachineFormatError, match="no text") as err:
        read_pairs(path)
    assert err.value.line == 1 and err.value.field == "prompt"
    rows = [{"id": "g", "tag": "good", "messages": [msg("assistant", "answer: 10")]},
            {"id": "b", "tag": "bad", "messages": [msg("assistant", "5 + 5 = 11.")]}]
    pairs = preference_pairs(rows, machine={"name": None}, instructions="", exclude=[], sources=["tags"])
    assert len(pairs) == 0 and pairs.skipped_counts().to_dict() == {"no prompt text": 1}


def test_damaged_run_dicts_given_as_runs_are_skipped_not_a_traceback():
    """Runs passed as dicts are not checked on loading as a workspace's run files are."""
    def scored(rid, reply, scorecard, **over):
        return {"id": rid, "machine": "tutor", "input": "Q?", "instructions": SYSTEM, "scorecard": scorecard,
                "startedAt": f"2026-11-01T18:0{len(rid)}:00.000Z",
                "trajectory": [msg("user", "Q?"), msg("assistant", reply)], **over}

    runs = [scored("a", "answer: 1", {"total": 1.0}), scored("bb", "1?", "n/a"),
            scored("ccc", "2?", {"total": 0.5}, trajectory=["oops", msg("user", "Q?"), msg("assistant", "2?")]),
            scored("dddd", "3?", {"total": 0.0}, history="not a list")]
    pairs = preference_pairs([], runs, machine=MACHINE, exclude=[], sources=["scores"])
    assert len(pairs) == 0
    assert sorted((s["id"], s["reason"]) for s in pairs.skipped) == [
        ("bb", "unscored run"), ("ccc", "a message that is not an object"),
        ("dddd", "a message that is not an object")]


def test_writing_no_pairs_leaves_the_file_there_as_it_was(tmp_path):
    """A pairs file with no pairs is refused by read_pairs and by DPO: writing one over a good file
    would lose it for nothing."""
    path = write_pairs([good_record()], tmp_path / "pairs.jsonl")
    before = path.read_bytes()
    empty = preference_pairs([], machine=MACHINE, exclude=[], sources=["tags"])
    with pytest.raises(ValueError, match="no pairs to write") as err:
        write_pairs(empty, path)
    assert str(path) in str(err.value) and path.read_bytes() == before
    assert len(read_pairs(path)) == 1


def test_a_tagged_frame_saved_as_parquet_gives_the_same_pairs(tmp_path):
    store = tmp_path / "store"
    turn = [msg("user", "Compute 4 + 4.")]
    mnb.tag(turn + [msg("assistant", "answer: 8")], "good", store=store, id="g")
    mnb.tag(turn + [msg("assistant", "4 + 4 = 9.")], "bad", store=store, id="b")
    mnb.tag(turn + [msg("assistant", "4 + 4 = 9.")], "good", rewrite="answer: 8!", store=store, id="rw")
    frame = mnb.tagged(store)
    direct = preference_pairs(frame, machine=MACHINE, exclude=[])
    assert len(direct) == 2  # the rewrite, and good over bad (the rewrite over bad again is a duplicate)
    pd.DataFrame({"row": [dict(r) for r in frame["row"]]}).to_parquet(tmp_path / "tagged.parquet")
    again = pd.read_parquet(tmp_path / "tagged.parquet")
    assert type(again.iloc[0]["row"]["messages"]).__module__ == "numpy"
    assert texts(preference_pairs(again, machine=MACHINE, exclude=[])) == texts(direct)
    # a frame of the rows themselves (no `row` column), an empty cell being a key the row lacks
    rows = pd.DataFrame(list(frame["row"]))
    rows.to_parquet(tmp_path / "rows.parquet")
    assert texts(preference_pairs(pd.read_parquet(tmp_path / "rows.parquet"), machine=MACHINE, exclude=[])) == \
        texts(direct)


def test_tag_rows_that_name_no_machine_are_left_out_with_a_warning_when_a_machine_is_given():
    """Machine's own rows record no machine: with machine= they give no pair, and that is said."""
    q = "Compute 9 + 1."
    rows = [{"id": "g", "tag": "good", "messages": [msg("user", q), msg("assistant", "answer: 10")]},
            {"id": "b", "tag": "bad", "messages": [msg("user", q), msg("assistant", "9 + 1 = 11.")]},
            {"id": "o", "tag": "bad", "machine": "other", "messages": [msg("user", q), msg("assistant", "11")]}]
    with pytest.warns(UserWarning, match=r"left out 2 tag row\(s\) that name no machine.*machine=None"):
        pairs = preference_pairs(rows, machine={"name": "tutor", "instructions": SYSTEM}, exclude=[])
    assert len(pairs) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(preference_pairs(rows[:2], machine=MACHINE, exclude=[])) == 1


def test_a_tag_store_path_that_is_not_there_is_an_error_not_zero_pairs(tmp_path):
    """A mistyped store path read as an empty store: zero pairs and not a word."""
    missing = tmp_path / "no-such-store"
    with pytest.raises(MachineFormatError, match="no tag store") as err:
        preference_pairs(missing, machine=MACHINE, exclude=[])
    assert err.value.path == str(missing) and "sources=" in str(err.value)
    # score pairs alone read no store
    assert len(preference_pairs(missing, [], machine=MACHINE, exclude=[], sources=["scores"])) == 0


def test_cli_pairs_with_no_pairs_says_why_and_leaves_the_out_file(tmp_path, capsys):
    """`machine-nb pairs -o F` on a store with no pairs: the skip counts still print, F stays as it
    was, and the exit status says nothing was written."""
    from machine_nb.cli import main

    store = tmp_path / "store"
    store.mkdir()
    (store / "train.jsonl").write_text(json.dumps({"id": "a1", "tag": "good", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n")
    out = tmp_path / "pairs.jsonl"
    out.write_text("kept\n")
    assert main(["pairs", "--store", str(store), "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert "0 pair(s)" in captured.out and "no pairs to write" in captured.err and out.read_text() == "kept\n"


def test_dpo_refuses_a_pair_whose_replies_differ_only_in_unicode_form():
    """dpo's own check compared replies stripped only: "café" (é composed) against "café" (e + accent)
    reached training as a preference with nothing to learn."""
    from machine_nb.errors import MachineFormatError
    from machine_nb.training.preference import score_pairs

    pair = {"prompt": [{"role": "user", "content": "Say café."}], "chosen": [{"role": "assistant", "content": "caf\u00e9"}],
            "rejected": [{"role": "assistant", "content": "cafe\u0301 "}]}
    with pytest.raises(MachineFormatError, match="same"):
        score_pairs([pair])
