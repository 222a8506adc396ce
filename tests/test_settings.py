"""sft and dpo hand each setting to their one settings class (SFTSettings, DPOSettings) by name,
with the class's default, and keep the run's other arguments (data, log dir, progress…) apart."""

import dataclasses
import inspect

import pytest

from machine_nb.training.preference import DPOSettings, dpo
from machine_nb.training.train import SFTSettings, sft

RUN_ARGUMENTS = {"log_dir", "workspace", "name", "resume", "progress", "on_metrics", "eval_data"}


class Handed(Exception):
    """What the call handed to its settings class, stopping it there."""


@pytest.mark.parametrize("fn, cls, data, extra, derived", [
    (sft, SFTSettings, "data", {"inspect_tasks"}, {"submit_ahead"}),
    (dpo, DPOSettings, "pairs", {"inspect_tasks"}, set()),
])
def test_every_setting_of_the_call_reaches_its_settings_class(monkeypatch, fn, cls, data, extra, derived):
    params = inspect.signature(fn).parameters
    fields = {f.name: f for f in dataclasses.fields(cls)}
    settings = [n for n in params if n in fields]
    assert set(params) - set(settings) == {data} | RUN_ARGUMENTS | extra  # each keyword is a setting or the run's
    assert set(fields) - set(settings) == derived  # and each setting a keyword, or the class's own
    for n in settings:
        if fields[n].default is not dataclasses.MISSING:
            assert params[n].default == fields[n].default, n  # one default, the same in both places

    def stop(klass, resumed, /, **given):
        raise Handed(given)

    monkeypatch.setattr(cls, "resolve", classmethod(stop))
    values = {n: f"<{n}>" for n in settings}
    with pytest.raises(Handed) as got:
        fn("rows.jsonl", **values)
    assert got.value.args[0] == values


def test_a_name_that_is_not_a_setting_is_refused():
    with pytest.raises(TypeError, match="SFTSettings has no setting 'epoch'"):
        SFTSettings.resolve(None, model="local/arith-tiny", epoch=3)


NAN = float("nan")


@pytest.mark.parametrize("cls, name, value", [
    (SFTSettings, "learning_rate", NAN), (SFTSettings, "learning_rate", -1e-3), (SFTSettings, "learning_rate", 0.0),
    (SFTSettings, "epochs", 1.5), (SFTSettings, "batch_size", 2.5), (SFTSettings, "max_steps", 3.5),
    (SFTSettings, "save_every", -5), (SFTSettings, "lr_schedule", "cosin"), (SFTSettings, "eval_temperature", NAN),
    (SFTSettings, "eval_temperature", -1.0), (SFTSettings, "max_usd", NAN), (SFTSettings, "max_usd", -1.0),
    (DPOSettings, "beta", NAN), (DPOSettings, "learning_rate", NAN),
    (SFTSettings, "lora_rank", 129), (DPOSettings, "lora_rank", 129),  # past the tiny model's width, 128
    (SFTSettings, "eval_max_tokens", 0), (SFTSettings, "eval_max_tokens", 2.5), (SFTSettings, "eval_every", -3),
    (SFTSettings, "eval_every", 1.5),
])
def test_a_value_no_run_can_use_is_refused_naming_its_setting(cls, name, value):
    """Refused as the settings resolve, before a log dir is made: not by the cookbook or the engine
    part way into the run (a NaN budget would pass every comparison and bound nothing)."""
    with pytest.raises(ValueError, match=name):
        cls.resolve(None, model="local/arith-tiny", **{name: value})


def test_a_refused_setting_writes_nothing(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"What is {i} plus 1?"},
                          {"role": "assistant", "content": f"answer: {i + 1}"}]} for i in range(8)]
    with pytest.raises(ValueError, match="learning_rate"):
        sft(rows, learning_rate=NAN, log_dir=tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_numpy_numbers_are_taken_as_the_numbers_they_stand_for():
    """Settings taken from a DataFrame row or an np.arange grid arrive as numpy numbers: they resolve to
    plain ints and floats (a run record and a child's spec are JSON), and a NaN among them is refused."""
    import numpy as np

    s = SFTSettings.resolve(None, model="local/arith-tiny", epochs=np.int64(2), batch_size=np.int32(4),
                            learning_rate=np.float32(1e-3), max_usd=np.float64(1.5))
    assert (s.epochs, s.batch_size) == (2, 4) and type(s.epochs) is int and type(s.batch_size) is int
    assert type(s.learning_rate) is float and abs(s.learning_rate - 1e-3) < 1e-9 and type(s.max_usd) is float
    with pytest.raises(ValueError, match="learning_rate"):
        SFTSettings.resolve(None, model="local/arith-tiny", learning_rate=np.float32("nan"))
