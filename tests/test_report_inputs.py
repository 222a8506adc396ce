"""What goes into a report, and what must not come out: parameters a notebook cannot be given are
refused by name, and a secret never reaches the report in a form the redaction misses (split over a
notebook's lines, nested in a parameter, in a URL's query, escaped as Python or a URL escapes it).

run_report's tests use papermill's own parameter injection (`prepare_only`) and no kernel: the
outputs a cell would print are added by hand."""

import datetime
import json
import urllib.parse
from pathlib import Path

import nbformat
import pytest

from machine_nb.core.redact import REDACTED, redacted, scrub, secret_values
from machine_nb.reports import notebook as report_mod
from machine_nb.reports.notebook import SUMMARY_MIME, run_report, scrub_notebook

FAKE_KEY_BODY = "MIIEfakefakeFAKEtml0test0canary0000000000000000000000000000000000"


def _notebook(path: Path, *sources: str, params: str = "x = 1") -> Path:
    """A notebook whose first cell is its `parameters` cell (`params`), then one code cell per source."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]}),
                *(nbformat.v4.new_code_cell(s) for s in sources)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(nbformat.writes(nb))
    return path


@pytest.fixture
def no_kernel(monkeypatch):
    """papermill injects the parameters (its own code) but runs no cell; `outputs` (a list of
    nbformat outputs) is put on the last cell, as if it had printed them."""
    import papermill

    real = papermill.execute_notebook
    outputs: list = []

    def execute(input_path, output_path, parameters=None, kernel_name=None, **_):
        real(input_path, output_path, parameters=parameters, kernel_name=kernel_name, prepare_only=True,
             progress_bar=False)
        nb = nbformat.reads(report_mod._MEMORY.read(output_path), as_version=4)
        nb.cells[-1].outputs = list(outputs)
        report_mod._MEMORY.write(nbformat.writes(nb), output_path)

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    return outputs


def test_a_private_key_printed_over_several_lines_is_redacted_whole_in_the_executed_notebook():
    # nbformat stores a multi-line output as a list of lines: the key's body is on lines of its own
    key = f"-----BEGIN PRIVATE KEY-----\n{FAKE_KEY_BODY}\n{FAKE_KEY_BODY[::-1]}\n-----END PRIVATE KEY-----\n"
    multi_line_env = "tml-test-canary-line-one-0000\ntml-test-canary-line-two-0000"
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(key)\nprint(creds)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="the key:\n" + key),
                    nbformat.v4.new_output("execute_result", data={"text/plain": f"'{multi_line_env}'\nend"},
                                           execution_count=1)]
    nb.cells = [cell]
    as_saved = json.loads(nbformat.writes(nb))
    assert isinstance(as_saved["cells"][0]["outputs"][0]["text"], list)  # the shape run_report scrubs

    secrets = secret_values({"GCP_CREDENTIALS": multi_line_env})
    out, n = scrub_notebook(as_saved, secrets, "/nowhere")
    text = json.dumps(out)
    assert FAKE_KEY_BODY not in text and FAKE_KEY_BODY[::-1] not in text
    assert "line-two" not in text and "line-one" not in text
    assert n == 2
    # still a notebook nbformat reads, its text on separate lines as before
    cell_out = nbformat.reads(json.dumps(out), as_version=4).cells[0].outputs
    assert cell_out[0].text == f"the key:\n{REDACTED}\n"
    assert isinstance(out["cells"][0]["outputs"][0]["text"], list)


def test_a_secret_inside_a_secret_named_dict_or_list_parameter_is_redacted():
    params = {"creds": {"user": "u", "password": "tml-test-canary-pw-0000", "pin": 4821},
              "service": {"url": "https://api.example", "api_key": "fake-svc-canary-0000"},
              "auth": ["fake-tok-canary-aaaa", "fake-tok-canary-bbbb"], "steps": 3}
    found = secret_values(params)
    for value in ("tml-test-canary-pw-0000", "4821", "fake-svc-canary-0000", "fake-tok-canary-aaaa",
                  "fake-tok-canary-bbbb"):
        assert value in found
    assert "3" not in found and "https://api.example" not in found and "u" not in found


def test_a_nested_secret_parameter_reaches_neither_page_nor_notebook(tmp_path, no_kernel):
    nb = _notebook(tmp_path / "nb.ipynb", "print(creds)", params="creds = {}\nservice = {}")
    rep = run_report(nb, {"creds": {"password": "tml-test-canary-pw-0000", "pin": 4821},
                          "service": {"api_key": "fake-svc-canary-0000"}}, tmp_path / "out" / "r.html",
                     progress=False)
    for path in (rep.html, rep.executed):
        text = path.read_text()
        for secret in ("tml-test-canary-pw-0000", "4821", "fake-svc-canary-0000"):
            assert secret not in text, (path.name, secret)
    injected = json.loads(rep.executed.read_text())["metadata"]["papermill"]["parameters"]
    assert injected["creds"] == {"password": REDACTED, "pin": REDACTED}


@pytest.mark.parametrize("text, shown", [
    ("GET https://api.example.com/v1/items?api_key=fakeCANARY0000zz&page=2",
     f"GET https://api.example.com/v1/items?api_key={REDACTED}&page=2"),
    ("https://maps.example.com/embed?q=paris&key=fakeCANARY0000zz",
     f"https://maps.example.com/embed?q=paris&key={REDACTED}"),
    ("401 for url: https://h.example/x?access_token=fake.CANARY-00%2B00#frag",
     f"401 for url: https://h.example/x?access_token={REDACTED}#frag"),
    ("<a href='https://h.example/?page=1&amp;auth=fakeCANARY0000'>", f"<a href='https://h.example/?page=1&amp;auth={REDACTED}'>"),
    ("https://h.example/?page=2&sort=name&limit=on", "https://h.example/?page=2&sort=name&limit=on"),
])
def test_a_secret_named_query_parameter_in_a_url_is_redacted(text, shown):
    assert redacted(text) == shown


def test_a_secret_is_redacted_in_its_python_escaped_and_percent_encoded_forms():
    secret = "Pässwort+tml/canary=0000"
    secrets = secret_values({"SERVICE_TOKEN": secret})
    forms = [
        secret.encode("unicode_escape").decode("ascii"),  # papermill's injected cell: "P\xe4sswort…"
        urllib.parse.quote(secret, safe=""),  # a URL built with quote / requests' params
        urllib.parse.quote_plus(secret),
    ]
    for form in forms:
        text, n = scrub(f"token = \"{form}\" seen", secrets)
        assert text == f"token = \"{REDACTED}\" seen" and n == 1, form


def test_a_non_ascii_secret_parameter_is_not_left_in_the_injected_cell(tmp_path, no_kernel):
    nb = _notebook(tmp_path / "nb.ipynb", "pass", params="api_token = ''")
    rep = run_report(nb, {"api_token": "Pässwort-tml-canary-0000"}, tmp_path / "out" / "r.html", progress=False)
    for path in (rep.html, rep.executed):
        text = path.read_text()
        assert "sswort-tml-canary" not in text, path.name


@pytest.mark.parametrize("parameters, named", [
    ({"learning-rate": 0.1}, "'learning-rate'"),
    ({"class": 1}, "'class'"),
    ({"when": datetime.date(2024, 1, 2)}, "'when'"),
    ({"grid": {1: "a"}}, "'grid'"),
    ({"opts": {"seen": {1, 2}}}, "'opts'"),
])
def test_a_parameter_a_notebook_cannot_be_given_is_refused_by_name_before_anything_runs(tmp_path, parameters,
                                                                                       named):
    nb = _notebook(tmp_path / "nb.ipynb", "pass")
    with pytest.raises(ValueError, match=named):
        run_report(nb, parameters, tmp_path / "out" / "r.html", progress=False)
    assert not (tmp_path / "out").exists()


def test_numpy_numbers_tuples_and_paths_reach_the_notebook_as_their_python_values(tmp_path, no_kernel):
    np = pytest.importorskip("numpy")
    nb = _notebook(tmp_path / "nb.ipynb", "pass", params="epochs = lr = shape = data = None")
    rep = run_report(nb, {"epochs": np.int64(3), "lr": np.float32(0.5), "shape": (2, 3),
                          "data": tmp_path / "d.jsonl"}, tmp_path / "out" / "r.html", progress=False)
    source = "".join(json.loads(rep.executed.read_text())["cells"][1]["source"])
    assert "epochs = 3\n" in source and "lr = 0.5\n" in source and "shape = [2, 3]\n" in source
    assert 'data = "d.jsonl"' in source  # a path under the notebook's folder, written relative to it


def test_a_report_that_cannot_be_rendered_leaves_the_previous_pair_untouched(tmp_path, no_kernel):
    nb = _notebook(tmp_path / "nb.ipynb", "pass")
    out = tmp_path / "out" / "r.html"
    out.parent.mkdir()
    out.write_text("previous page")
    out.with_suffix(".ipynb").write_text("previous notebook")
    no_kernel.append(nbformat.v4.new_output("display_data", data={SUMMARY_MIME: {"points": "not a list"}}))
    with pytest.raises(ValueError, match="report summary"):
        run_report(nb, {}, out, progress=False)
    assert out.read_text() == "previous page"
    assert out.with_suffix(".ipynb").read_text() == "previous notebook"
