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
