"""Secrets: what counts as one, and how text is redacted before anyone sees it.

The one home for the rule, so a report, an eval's per-row errors, a training error and
validate's findings all redact the same things.

What is redacted (`[redacted]`):
- the value of every environment variable, and every `parameters` entry, with a secret name
  (inside a dict or list parameter too: every value under a secret-named key, whole). The name's
  words (split at `_`, `-` and other non-letters and at case changes: `apiKey` is `api`, `Key`) say it:
  a word ending in PASSWORD, PASSWD, PASSPHRASE, SECRET, CREDENTIAL or SIGNATURE (each plural too), a
  word CREDS, COOKIE(S) or SIG (a presigned URL's signature), a word PASS, PWD or PAT in a longer
  name, a word starting with AUTH (not AUTHOR);
  KEY(S) or TOKEN(S) after API, ACCESS, PRIVATE, REFRESH, SESSION, CLIENT, SERVICE, … (or fused:
  `APIKEY`); the singular KEY or TOKEN anywhere in the name, or a word ending in it (`OPENAIKEY`), unless
  the word before names a data key or a tokenizer's token (`sort_key`, `case_key`, `pad_token`,
  `eos_token`) or the word after says what about it the name holds (`token_count`, `key_column`,
  `HF_TOKEN_PATH`). So `TINKER_API_KEY`, `api_keys`, `HF_TOKEN`, `GITHUB_TOKEN_RO`, `access_tokens`,
  `passwords`, `DB_PASS`, `HF_AUTH`, `GCP_CREDENTIALS` are secret names, and `max_tokens`, `tokenizer`,
  `token_count`, `key_column`, `sort_key`, `monkey`, `PWD`, `OLDPWD` (the working directory) and
  `GIT_AUTHOR_NAME` are not;
- whatever its length, except blank values, values under 3 characters and common flag words
  ("true", "false", "yes", "no", "on", "off", "none", "null", "0", "1", …), which would garble the
  report and protect nothing. A value under 8 characters is replaced only where it stands as a
  whole word ("hunter2", not "hunter22"); a longer one wherever it occurs; JSON-, HTML-,
  Python- or URL-escaped too (`p&amp;ss` in a table a notebook displays shows as `p&ss` on the
  page; `"P\\xe4ss"` is how a notebook's injected parameters cell writes `Päss`; `p%40ss` is `p@ss`
  in a URL);
- the password of any URL with one (`postgres://user:[redacted]@host/db`, an `@` in the password
  too), and a token given as a URL's whole userinfo (`https://[redacted]@host`: 20 or more
  characters with a digit), in an environment value or anywhere in the text;
- the value of `password=…` (also `passwd`, `passphrase`, `pwd`, any case) in a libpq DSN
  (`host=db user=u password=[redacted]`), a JDBC URL (`?user=u&password=[redacted]`,
  `;password=[redacted];`), an ODBC string or a `.env` line; quoted values too;
- the value of a secret-named query parameter in a URL (`?api_key=[redacted]&page=2`,
  `&access_token=…`, `&amp;token=…` in HTML);
- key-shaped strings (SECRET_PATTERNS: `sk-…`, `tml-…`, AWS, GitHub, Slack and Hugging Face tokens,
  Google API keys, JSON web tokens, private key blocks, PGP's too), set in the environment or not.
"""

from __future__ import annotations

import html
import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

def _key(prefix: str, rest: str) -> re.Pattern[str]:
    """A key that starts with `prefix` (a pattern of fixed width), not inside a word, or right after
    an escaped control character of JSON or Python text (`"see\\nsk-…"`, as json.dumps prints a new
    line inside a string). The prefix comes first in the pattern and the start is checked behind it,
    so a search skips to each occurrence of the prefix instead of trying every position."""
    return re.compile(rf"{prefix}(?:(?<!\w{prefix})|(?<=\\[nrtbf]{prefix})){rest}")


SECRET_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("API key (sk-…)", _key("sk-", r"[A-Za-z0-9_\-]{20,}")),
    ("Tinker key (tml-…)", _key("tml-", r"[A-Za-z0-9_\-]{20,}")),
    ("AWS access key", _key("AKIA", r"[0-9A-Z]{16}\b")),
    ("GitHub token", _key("gh[pousr]_", r"[A-Za-z0-9]{30,}")),
    ("Slack token", _key("xox[abposr]-", r"[A-Za-z0-9\-]{10,}")),
    ("GitHub token (fine-grained)", _key("github_pat_", r"[A-Za-z0-9_]{40,}")),
    ("Hugging Face token", _key("hf_", r"[A-Za-z0-9]{30,}")),
    ("Google API key", _key("AIza", r"[0-9A-Za-z_\-]{35}")),
    ("JSON web token", _key("eyJ", r"[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}")),
)

REDACTED = "[redacted]"
# A name's words: `TINKER_API_KEY`, `apiKey`, `APIKey`, `X-Amz-Security-Token` split at non-letters and case
# changes; digits are left out (`api_key2` is `api`, `key`).
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
# A word ending in one of these names a credential wherever it stands (`MYPASSWORD`, `client_secret`, `secrets`).
_CREDENTIAL_ENDINGS = tuple(word + plural for word in ("PASSWORD", "PASSWD", "PASSPHRASE", "SECRET", "CREDENTIAL",
                                                     "SIGNATURE")
                            for plural in ("", "S"))
# a presigned URL's signature (S3's `X-Amz-Signature`, an Azure SAS `sig`) grants access to whoever holds it
_CREDENTIAL_WORDS = {"CREDS", "COOKIE", "COOKIES", "SIG"}
# in a longer name only: `DB_PASS`, `GH_PAT`; `pass` and `PWD` (the working folder) are not
_CREDENTIAL_PARTS = {"PASS", "PWD", "PAT"}
_NOT_AUTH = {"AUTHOR", "AUTHORS"}  # AUTH… is a credential (`HF_AUTH`, `X_AUTHORIZATION`), an author is not
# KEY and TOKEN name credentials and ordinary things alike (`api_key`, `HF_TOKEN`, `OPENAI_KEY_PROD`;
# `sort_key`, `max_tokens`, `pad_token`, `token_count`). After one of these words, a key or token of either
# number is a credential (`access_tokens`); fused too (`APIKEY`, `accessToken`).
_CREDENTIAL_KINDS = {"API", "ACCESS", "PRIVATE", "REFRESH", "BEARER", "SESSION", "CLIENT", "SERVICE", "SIGNING",
                     "ENCRYPTION", "MASTER", "LICENSE", "SSH", "DEPLOY", "SECURITY", "OAUTH", "WEBHOOK", "APP"}
# Otherwise the singular KEY or TOKEN anywhere in a name is one (`KAGGLE_KEY`, `HF_TOKEN`, `GITHUB_TOKEN_RO`), and
# so is a word ending in it (`OPENAIKEY`), unless the word before names a data key or a tokenizer's token, or
# the word after says what about it the name holds (`token_count`, `key_column`, `HF_TOKEN_PATH`). A plural is
# a count or a collection (`max_tokens`, `sort_keys`). A redacted value that was no secret costs a word of a
# report; a secret left in costs the secret: when in doubt, a name is a secret name.
_ORDINARY = {"KEY": {"SORT", "PRIMARY", "FOREIGN", "PARTITION", "GROUP", "JOIN", "INDEX", "LOOKUP", "CACHE", "DICT",
                     "MAP", "ROW", "COLUMN", "COL", "FIELD", "SHARD", "DEDUP", "CASE", "CHECK", "LABEL", "TEXT",
                     "PROMPT", "INPUT", "OUTPUT", "TARGET", "METRIC", "LOSS", "RNG", "PRNG", "RANDOM", "HOT"},
             "TOKEN": {"BOS", "EOS", "EOT", "PAD", "UNK", "SEP", "CLS", "MASK", "STOP", "START", "END", "SPECIAL",
                       "IMAGE", "AUDIO", "VIDEO", "NEXT", "FIRST", "LAST", "NEW", "PROMPT", "INPUT", "OUTPUT",
                       "TARGET", "TEXT"}}
_ABOUT = {"COUNT", "COUNTS", "COLUMN", "COLUMNS", "COL", "ID", "IDS", "LEN", "LENGTH", "LIMIT", "LIMITS", "NAME",
          "NAMES", "TYPE", "TYPES", "FIELD", "FIELDS", "INDEX", "IDX", "POS", "POSITION", "PATH", "FILE", "DIR",
          "BUDGET", "USAGE", "RATE", "SIZE", "NUM", "MAP", "ORDER", "LAYOUT"}
_FUSED = {kind + noun + plural for kind in _CREDENTIAL_KINDS for noun in _ORDINARY for plural in ("", "S")}
_WORDS_ENDING_IN_KEY = {"MONKEY", "DONKEY", "TURKEY", "HOCKEY", "JOCKEY", "WHISKEY", "HOTKEY", "LACKEY"}
_MIN_SECRET_LEN = 3  # shorter values ("1", "no") are not secrets, and redacting them garbles text
_WHOLE_WORD_BELOW = 8  # shorter values are replaced only as whole words: "abc1" not inside "abc12"
_COMMON_VALUES = {"true", "false", "yes", "no", "on", "off", "none", "null", "nil", "0", "1", "auto", "default",
                  "enabled", "disabled", "local", "dev", "test", "prod"}
# scheme://user:PASSWORD@host — the user holds no ":", "/", "@" or whitespace; the password may
# hold ":" and "@" (a password with an unescaped "@" is common): it runs to the last "@" before the
# host, which holds no "@". Or scheme://TOKEN@host, a token as the whole userinfo (git hosts take one):
# 20 or more characters with a digit among them, so a user name (`ssh://git@host`) is left alone
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@\"'<>]*:|\b[A-Za-z][A-Za-z0-9+.\-]*://(?=[\w.~\-]*\d))"
                           r"((?<=:)[^\s/\"'<>]+|(?<=//)[\w.~\-]{20,})"
                           r"(?=@[^\s/@\"'<>]*(?:[/?#\s\"'<>;,)\]]|$))")
# password=VALUE in a libpq DSN (`host=db user=u password=x`), a JDBC URL's parameters
# (`?user=u&password=x`, `;password=x;`), an ODBC string (`PWD=x`) or a `.env` line: the value
# runs to whitespace, "&" or ";" (or is quoted); a value followed by "(" or "[" is code, not a secret
_KEY_PASSWORD = re.compile(
    r"(?i)(?<![A-Za-z0-9])((?:password|passwd|passphrase|pwd)\s*=\s*)"
    r"('(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|[^\s&;'\"<>()\[\]{},]++(?![(\[]))")
# NAME=VALUE after "?", "&" or ";" (`&amp;` in HTML): a URL's query parameter; redacted when NAME is
# secret-named (is_secret_name). The value runs to the next parameter, the fragment, a quote or a bracket.
_QUERY_VALUE = re.compile(r"(?<=[?&;])([A-Za-z][A-Za-z0-9_.\-]*=)([^\s&#;'\"<>()\[\]{},]+)")


def mask(secret: str) -> str:
    """A secret shown safely, where a finding must say which one it is.

    Args:
        secret: the secret text.

    Returns:
        Its first 4 characters and its length: "sk-a…(51 chars)".
    """
    return f"{secret[:4]}…({len(secret)} chars)"


def is_secret_name(name: str) -> bool:
    """Whether a variable's name says it holds a secret (the rule in this module's docstring).

    Args:
        name: an environment variable's, parameter's, dict key's or URL query parameter's name.

    Returns:
        True for `TINKER_API_KEY`, `api_keys`, `HF_TOKEN`, `access_tokens`, `passwords`, `DB_PASS`, `HF_AUTH`, …;
        False for `sort_key`, `max_tokens`, `tokenizer`, `pad_token`, `key_column`, `PWD`, `GIT_AUTHOR_NAME`, ….
    """
    words = [w.upper() for w in _WORD.findall(str(name))]
    for i, word in enumerate(words):
        if (word.endswith(_CREDENTIAL_ENDINGS) or word in _FUSED or (word.startswith("AUTH") and word not in _NOT_AUTH)
                or word in _CREDENTIAL_WORDS or (word in _CREDENTIAL_PARTS and len(words) > 1)):
            return True
        noun = word[:-1] if word in ("KEYS", "TOKENS") else word
        if noun in _ORDINARY and i and words[i - 1] in _CREDENTIAL_KINDS:
            return True
        if word in _ORDINARY:
            if not ((i and words[i - 1] in _ORDINARY[word]) or (i + 1 < len(words) and words[i + 1] in _ABOUT)):
                return True
        elif word.endswith(("KEY", "TOKEN")) and word not in _WORDS_ENDING_IN_KEY:
            return True
    return False


def _worth_redacting(value: str) -> bool:
    v = value.strip()
    return len(v) >= _MIN_SECRET_LEN and v.lower() not in _COMMON_VALUES


def _secret_query(m: re.Match[str]) -> bool:
    """Whether a _QUERY_VALUE match is a secret-named parameter whose value is worth redacting."""
    return m.group(2) != REDACTED and is_secret_name(m.group(1)[:-1]) and _worth_redacting(m.group(2))


def _secret_query_values(text: str) -> list[str]:
    return [m.group(2) for m in _QUERY_VALUE.finditer(text) if _secret_query(m)]


def secret_values(environ: Mapping[str, Any] | None = None) -> list[str]:
    """The values to redact, longest first.

    Args:
        environ: the variables to read (default None: os.environ), or a report's parameters: a
            dict or list value is read inside (a key of a dict inside names its value as a
            variable does), a number under a secret name is a secret as the text it prints as;
            other values (booleans, None, objects) are skipped.

    Returns:
        The values of secret-named variables (and keys) worth redacting, and the password of any
        URL, DSN or JDBC value and the value of a URL's secret-named query parameter.
    """
    environ = os.environ if environ is None else environ
    values = set()
    stack: list[tuple[Any, Any, bool]] = [(name, value, False) for name, value in environ.items()]
    while stack:
        name, value, inside_secret = stack.pop()
        secret = inside_secret or (isinstance(name, str) and is_secret_name(name))
        if isinstance(value, Mapping):
            stack.extend((key, item, secret) for key, item in value.items())
            continue
        if isinstance(value, (list, tuple)):
            stack.extend((name, item, secret) for item in value)
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if secret and _worth_redacting(str(value)):
                values.add(str(value))
            continue
        if not isinstance(value, str):
            continue
        if secret and _worth_redacting(value):
            values.add(value)
        for m in _URL_PASSWORD.finditer(value):
            if _worth_redacting(m.group(2)):
                values.add(m.group(2))
        for m in _KEY_PASSWORD.finditer(value):
            bare = m.group(2)[1:-1] if m.group(2)[:1] in "'\"" else m.group(2)
            if _worth_redacting(bare):
                values.add(bare)
        values.update(_secret_query_values(value))
    return sorted(values, key=len, reverse=True)


def connection_passwords(text: str) -> list[str]:
    """The passwords a text holds in a URL (`scheme://user:PW@host`) or a `password=PW` setting
    (libpq DSN, JDBC, ODBC, `.env`), as scrub finds them.

    Args:
        text: the text.

    Returns:
        The passwords worth redacting, in order of appearance (quotes removed).
    """
    out = [m.group(2) for m in _URL_PASSWORD.finditer(text)]
    out += [m.group(2)[1:-1] if m.group(2)[:1] in "'\"" else m.group(2) for m in _KEY_PASSWORD.finditer(text)]
    return [p for p in out if p != REDACTED and _worth_redacting(p)]


@lru_cache(maxsize=1)
def _key_shapes() -> re.Pattern[str]:
    """One pattern for every key-shaped string validate knows, a private key as its whole block."""
    shapes = [p.pattern for name, p in SECRET_PATTERNS if name != "private key"]
    block = (r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
             r"(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|[\s\S]*)")
    return re.compile("|".join([block, *shapes]))


def _escaped_forms(secret: str) -> set[str]:
    """The forms a value takes in a notebook's text: raw, JSON-escaped, HTML-escaped as views
    escape it (pandas: `&`, `<`, `>`; html.escape: quotes too; theme.escape: `$` as well),
    Python-escaped as papermill writes a string parameter (`"P\\xe4ss"`), and percent-encoded as in
    a URL (urllib's quote and quote_plus, which requests and urlencode use)."""
    quoted = html.escape(secret)
    python = secret.encode("unicode_escape").decode("ascii")
    return {secret, json.dumps(secret)[1:-1], html.escape(secret, quote=False), quoted, quoted.replace("$", "&#36;"),
            python, python.replace('"', '\\"'), urllib.parse.quote(secret), urllib.parse.quote(secret, safe=""),
            urllib.parse.quote_plus(secret)}


def scrub(text: str, secrets: list[str]) -> tuple[str, int]:
    """Redact secrets, URL, DSN and JDBC passwords, secret-named URL query values and key-shaped
    strings from a text.

    Args:
        text: the text.
        secrets: values to redact (secret_values), each in its raw, JSON-escaped and HTML-escaped
            forms; a value under 8 characters only where it stands as a whole word.

    Returns:
        (the text redacted, the number of replacements).
    """
    count = 0
    for s in secrets:
        for form in _escaped_forms(s):
            if form not in text:
                continue
            if len(form) >= _WHOLE_WORD_BELOW:
                count += text.count(form)
                text = text.replace(form, REDACTED)
            else:
                text, n = re.subn(rf"(?<![A-Za-z0-9_]){re.escape(form)}(?![A-Za-z0-9_])", REDACTED, text)
                count += n
    replaced = [0]

    def url(m: re.Match[str]) -> str:
        if m.group(2) != REDACTED:  # not already redacted as a known value
            replaced[0] += 1
        return m.group(1) + REDACTED

    text = _URL_PASSWORD.sub(url, text)

    def keyed(m: re.Match[str]) -> str:
        value = m.group(2)
        bare = value[1:-1] if value[:1] in "'\"" else value
        if bare == REDACTED or not _worth_redacting(bare):
            return m.group(0)
        replaced[0] += 1
        return m.group(1) + (value[0] + REDACTED + value[0] if value[:1] in "'\"" else REDACTED)

    text = _KEY_PASSWORD.sub(keyed, text)

    def query(m: re.Match[str]) -> str:
        if not _secret_query(m):
            return m.group(0)
        replaced[0] += 1
        return m.group(1) + REDACTED

    text = _QUERY_VALUE.sub(query, text)
    text, n = _key_shapes().subn(REDACTED, text)
    return text, count + replaced[0] + n


def redacted(text: str) -> str:
    """A text as anyone may see it.

    Args:
        text: the text (anything; it is made a string).

    Returns:
        The text with the environment's secrets, URL passwords and key-shaped strings redacted.
    """
    return scrub(str(text), secret_values())[0]
