"""A report's edges a user meets: a secret printed in pieces is still one secret, a token count or
a tokenizer is not a secret while an API key or an access token is, and a mistyped parameter name
stops the report before any kernel starts instead of running the notebook on its default."""

import json
from pathlib import Path

import nbformat
import pytest

from machine_nb.cli import main
from machine_nb.core.redact import REDACTED, is_secret_name, redacted, secret_values
from machine_nb.reports.notebook import run_report, scrub_notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SPLIT_KEY = ("tml-test-canary-", "split-0123456789abcdef")  # key-shaped only when whole
SPLIT_ENV = ("fake-service-", "canary-value-0000")  # a secret-named variable's value, printed in two pieces


def _notebook(path: Path, parameters: str | None, *sources: str) -> Path:
    """A notebook whose first cell is tagged `parameters` (none when `parameters` is None)."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"},
                                            "language_info": {"name": "python"}})
    cells = [] if parameters is None else [nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]})]
    nb.cells = [nbformat.v4.new_markdown_cell("# A small report"), *cells,
                *(nbformat.v4.new_code_cell(s) for s in sources)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(nbformat.writes(nb))
    return path


# --- a secret printed in two flushed pieces ------------------------------------------------------

def _stream(name: str, text: str) -> dict:
    return {"output_type": "stream", "name": name, "text": text}


def test_consecutive_stream_pieces_are_redacted_as_one_text():
    secrets = secret_values({"SERVICE_TOKEN": "".join(SPLIT_ENV)})
    nb = {"cells": [{"cell_type": "code", "id": "c0", "source": "print(...)", "metadata": {}, "outputs": [
        _stream("stdout", ["found ", SPLIT_KEY[0]]), _stream("stdout", [SPLIT_KEY[1] + "\n", "and "]),
        _stream("stdout", SPLIT_ENV[0]), _stream("stdout", SPLIT_ENV[1] + "\n"),
        _stream("stderr", "a warning\n"), _stream("stdout", "after the warning\n"),
        {"output_type": "display_data", "data": {"text/plain": "a view"}, "metadata": {}},
        _stream("stdout", "after the view\n")]}]}
    out, n = scrub_notebook(nb, secrets, "/nowhere")
    text = json.dumps(out)
    assert "canary" not in text and n == 2
    outputs = out["cells"][0]["outputs"]
    assert [(o["output_type"], o.get("name")) for o in outputs] == [
        ("stream", "stdout"), ("stream", "stderr"), ("stream", "stdout"), ("display_data", None), ("stream", "stdout")]
    assert outputs[0]["text"] == ["found [redacted]\n", "and [redacted]\n"]  # lines, as nbformat saves them
    assert nbformat.reads(json.dumps({**out, "nbformat": 4, "nbformat_minor": 5, "metadata": {}}), as_version=4)


def test_a_secret_printed_in_two_flushed_pieces_reaches_neither_the_notebook_nor_the_page(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVICE_TOKEN", "".join(SPLIT_ENV))  # the kernel inherits it
    nb = _notebook(tmp_path / "split.ipynb", "steps = 1",
                   "import os, sys\n"
                   "print('tml-' + 'test-canary-', end=''); sys.stdout.flush()\n"  # no piece whole in the source
                   "print('split-' + '0123456789abcdef')\n"
                   "value = os.environ['SERVICE_TOKEN']\n"
                   "print(value[:13], end=''); sys.stdout.flush()\n"
                   "print(value[13:])")
    rep = run_report(nb, {}, tmp_path / "out" / "split.html", progress=False)
    for path in (rep.executed, rep.html):
        text = path.read_text()
        assert SPLIT_KEY[1] not in text and SPLIT_ENV[1] not in text, path.name
    printed = [o for c in json.loads(rep.executed.read_text())["cells"] for o in c.get("outputs", [])
               if o["output_type"] == "stream"]
    assert ["".join(o["text"]) for o in printed] == [f"{REDACTED}\n{REDACTED}\n"]
    assert rep.redactions >= 2


# --- which names are secret names -----------------------------------------------------------------

SECRET_NAMES = ["api_key", "api_keys", "apiKey", "APIKey", "TINKER_API_KEY", "OPENAI_API_KEY_2", "password",
                "passwords", "db_pass", "secret", "client_secret", "secrets", "clientSecret", "auth_token",
                "access_tokens", "accessToken", "private_key", "HF_TOKEN", "GITHUB_TOKEN", "KAGGLE_KEY", "key",
                "token", "MACHINE_NB_SERVER_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "SECRET_KEY_BASE",
                "X-Amz-Security-Token", "refresh_tokens", "gh_pat", "session_cookie", "db_passphrase",
                "OPENAI_KEY_PROD", "GITHUB_TOKEN_RO", "OPENAIKEY", "passkey", "X-Amz-Signature", "sig",
                "url_signature"]
NOT_SECRET_NAMES = ["sort_key", "sortKey", "monkey", "keyboard", "KEYBOARD_LAYOUT", "max_tokens", "maxTokens",
                    "num_tokens", "max_new_tokens", "prompt_tokens", "tokens", "token_count", "tokenizer",
                    "tokenizer_dir", "key_column", "keys", "sort_keys", "pad_token", "eos_token", "bos_token_id",
                    "special_tokens", "case_key", "hotkey", "turkey", "pass", "num_passes", "PWD", "OLDPWD",
                    "GIT_AUTHOR_NAME", "PATH", "learning_rate", "HF_TOKEN_PATH", "token_id"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_credential_name_is_a_secret_name(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_a_count_a_tokenizer_or_a_data_key_is_not_a_secret_name(name):
    assert not is_secret_name(name)


def test_token_counts_show_in_a_report_while_keys_do_not():
    values = secret_values({"max_tokens": "4096-long", "tokenizer": "local/arith-tiny", "sort_key": "created_at",
                            "api_keys": ["fake-key-canary-aaaa", "fake-key-canary-bbbb"], "passwords": "tml-test-pw"})
    assert sorted(values) == ["fake-key-canary-aaaa", "fake-key-canary-bbbb", "tml-test-pw"]


# --- a parameter the notebook does not have -------------------------------------------------------

class Reached(Exception):
    """papermill was called: the parameters passed every check."""


@pytest.fixture
def papermill_reached(monkeypatch):
    import papermill

    def execute(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(papermill, "execute_notebook", execute)


def test_a_mistyped_parameter_is_refused_with_the_closest_names_before_any_kernel(tmp_path, papermill_reached):
    nb = _notebook(tmp_path / "train.ipynb", "epochs = 3  # passes over the data\nlearning_rate = 1e-3\nseed = 0",
                   "print(epochs)")
    with pytest.raises(ValueError) as refused:
        run_report(nb, {"epochz": 5, "learning_rat": 0.1, "seed": 1}, tmp_path / "out" / "r.html", progress=False)
    message = str(refused.value)
    assert "train.ipynb" in message and "cell 2" in message
    assert "'epochz'" in message and "'epochs'" in message
    assert "'learning_rat'" in message and "'learning_rate'" in message
    assert "'seed'" not in message.split("sets")[0]  # a known one is not called unknown
    assert not (tmp_path / "out").exists()


def test_a_parameter_for_a_notebook_without_a_parameters_cell_is_refused(tmp_path, papermill_reached):
    nb = _notebook(tmp_path / "plain.ipynb", None, "epochs = 3\nprint(epochs)")
    with pytest.raises(ValueError, match=r"plain\.ipynb.*no cell tagged 'parameters'.*'epochs'"):
        run_report(nb, {"epochs": 5}, tmp_path / "out" / "r.html", progress=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(Reached):  # no parameters: nothing to refuse
        run_report(nb, {}, tmp_path / "out" / "r.html", progress=False)


def test_every_name_a_parameters_cell_binds_is_a_parameter(tmp_path, papermill_reached):
    nb = _notebook(tmp_path / "forms.ipynb",
                   "%matplotlib inline\na, b = 1, 2\nc: int = 3\nd = e = 4\nif a:\n    f = 5\ngrid = {\n  'x': 1,\n}",
                   "pass")
    with pytest.raises(Reached):
        run_report(nb, dict.fromkeys("abcdef", 0) | {"grid": {}}, tmp_path / "out" / "r.html", progress=False)


def test_cli_report_refuses_a_mistyped_parameter(tmp_path, papermill_reached, capsys):
    nb = _notebook(tmp_path / "train.ipynb", "epochs = 3", "print(epochs)")
    assert main(["report", str(nb), "-p", "epochz", "3", "-o", str(tmp_path / "out" / "r.html")]) == 1
    err = capsys.readouterr().err
    assert "'epochz'" in err and "'epochs'" in err and "train.ipynb" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, parameters", [  # the parameters the tests run the committed notebooks with
    ("01_minimal_sft.ipynb", {"engine": "tinker", "model": "local/arith-tiny", "log_root": "r", "data_dir": "d",
                              "seed": 0, "epochs": 5, "max_steps": 30}),
    ("02_explore_runs.ipynb", {"workspace": "w", "store": "s", "export_path": "e.jsonl", "model": "local/arith-tiny"}),
    ("03_tag_train_promote.ipynb", {"workspace": "w", "machine": "helpdesk", "scratch_root": "s", "epochs": 1,
                                    "grader": "helpdesk_workspace:grade", "expect_live_at_most": None,
                                    "expect_candidate_at_least": None, "max_steps": 6, "batch_size": 2,
                                    "weak_steps": 0, "max_tokens": 64, "alpha": None}),
    ("05_preference.ipynb", {"workspace": "w", "machine": "helpdesk", "runs_root": "r",
                             "grader": "helpdesk_workspace:grade", "expect_pair_accuracy_at_least": None,
                             "expect_sft_exact_at_least": None}),
])
def test_the_committed_notebooks_take_the_parameters_they_are_run_with(name, parameters, tmp_path, papermill_reached):
    with pytest.raises(Reached):
        run_report(NOTEBOOKS / name, parameters, tmp_path / "out" / "r.html", progress=False)


@pytest.mark.parametrize("escape", ["\n", "\t", "\r"])
def test_a_key_after_an_escaped_newline_in_printed_json_is_redacted(escape):
    """`print(json.dumps(row))` writes a new line inside a string as the two characters `\\n`: a key
    right after it is still a key."""
    for key in ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789", "tml-test-canary-0123456789abcdef",
                "ghp_" + "a1" * 18):
        text = redacted(json.dumps({"content": "see" + escape + key}))
        assert key not in text and REDACTED in text, text
    assert redacted("a plain\\nnote") == "a plain\\nnote"


def test_a_token_given_as_a_urls_whole_userinfo_is_redacted_and_a_user_name_is_not():
    """`https://TOKEN@host` (a token with no user name before it, as git hosts take one) is a
    credential; `ssh://git@host` names a user."""
    token = "tmltestcanary0123456789abcdef"
    url = f"https://{token}@gateway.example/tinker"
    assert redacted(f"connecting to {url}") == f"connecting to https://{REDACTED}@gateway.example/tinker"
    assert token in secret_values({"TINKER_BASE_URL": url})
    assert redacted("ssh://git@github.com/org/repo.git") == "ssh://git@github.com/org/repo.git"
    assert redacted("https://build-bot@ci.example/x") == "https://build-bot@ci.example/x"


def test_a_presigned_urls_signature_is_redacted():
    """A presigned URL (S3's `X-Amz-Signature`, an Azure SAS `sig`) grants access to whoever holds it."""
    url = ("https://bucket.example/data.jsonl?X-Amz-Credential=AKIDEXAMPLE&X-Amz-Signature=fakecanary0123456789abcdef"
           "&sv=2024&sig=fakecanarySAS0123456789")
    text = redacted(url)
    assert "fakecanary0123456789abcdef" not in text and "fakecanarySAS0123456789" not in text
    assert "sv=2024" in text


# Canaries in the shapes the services issue (made up here: no service ever issued them)
HF_TOKEN_CANARY = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
GITHUB_PAT_CANARY = "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEF"
JWT_CANARY = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkNhbmFyeSJ9."
              + "c2lnbmF0dXJlLW9mLWEtbWFkZS11cC10b2tlbg")
GOOGLE_KEY_CANARY = "AIza" + "SyA-0123456789abcdefghijklmnopqrstu"
PGP_BLOCK = "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF0canary\n-----END PGP PRIVATE KEY BLOCK-----"


@pytest.mark.parametrize("secret", [HF_TOKEN_CANARY, GITHUB_PAT_CANARY, JWT_CANARY, GOOGLE_KEY_CANARY, PGP_BLOCK])
def test_hugging_face_github_google_jwt_and_pgp_keys_are_redacted_and_found_by_validate(secret):
    from machine_nb.checks.validate import secret_findings
    from machine_nb.core.redact import redacted

    text = f"the tool printed: {secret} (done)"
    shown = redacted(text)
    assert "lQOYBF0canary" not in shown and secret.splitlines()[0][12:] not in shown and "[redacted]" in shown
    assert shown.endswith("(done)") or "PGP" in secret
    assert [f for f in secret_findings(text) if f[0] == "error"], secret


def test_words_shaped_like_no_key_are_left_alone():
    from machine_nb.core.redact import redacted

    for text in ("hf_hub_download", "from huggingface_hub import hf_hub_url", "eyJ alone", "AIza", "github_pat_"):
        assert redacted(text) == text


def test_an_output_named_like_a_notebook_is_refused_before_the_page_replaces_the_executed_notebook(
        tmp_path, papermill_reached):
    """`run_report(nb, {}, "out.ipynb")`: the executed notebook goes to out.ipynb, then the page was
    written over it."""
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    with pytest.raises(ValueError, match=r"out\.ipynb.*\.html"):
        run_report(nb, {}, tmp_path / "out.ipynb", progress=False)
    assert not (tmp_path / "out.ipynb").exists()
