"""How an eval reply is scored: the match modes, Machine's text normalisation, numbers in text.

Pure functions over strings; the regexes eval rows carry run with a time bound (patterns.py).
Eval rows are checked against these rules in chat.py, sampled in evaluate.py and scored here.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from ..core import patterns

MATCH_MODES = ("exact", "prefix", "contains", "regex", "number")
"""exact/prefix/contains compare Machine-normalised text; regex fullmatches the stripped raw
output (time-bounded, see patterns.py); number compares the last number in the output with the
expected one."""

DEFAULT_MATCH = "exact"  # Machine's eval rows usually say "exact"; rows without "match" get it

# Trailing characters Machine's normalize() trims after lower-casing and collapsing whitespace.
_TRIM = " \t\n\r.,;:!?"
_WS = re.compile(r"\s+")
# A number as people write it: optional sign (a hyphen, a plus or U+2212, the minus sign), optional
# thousands commas, optional decimals, optional exponent ("1.5e3"). A sign right after a digit is a
# hyphen between two numbers ("3-5", "2024-01-05"), not the second number's sign.
_MINUS = "\u2212"
_NUMBER = re.compile(r"(?:(?<!\d)[-+\u2212])?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+\u2212]?\d+)?")
# The whole of an expected number: the same forms, commas only between groups of three digits.
_WHOLE_NUMBER = re.compile(r"[-+\u2212]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][-+\u2212]?\d+)?")


def normalize(text: str) -> str:
    """Machine's normalisation of a reply or an expected answer.

    Args:
        text: any text (other values go through `str`).

    Returns:
        The text stripped, lower-cased, its whitespace runs collapsed to one space, and trailing
        ` \\t\\n\\r.,;:!?` trimmed ("Answer:  62." -> "answer: 62").
    """
    return _WS.sub(" ", str(text).strip().lower()).strip(_TRIM)


def to_number(text: Any) -> Decimal | None:
    """A number written as text, thousands commas allowed ("1,234.5" -> Decimal("1234.5")).

    Args:
        text: the number's text (other values go through `str`): an optional sign (U+2212, the
            minus sign, counts as "-"), digits with optional commas between groups of three,
            optional decimals and an optional exponent ("1e3").

    Returns:
        The Decimal, or None when the text is not a finite number: a comma that does not separate
        thousands ("1,5"), NaN and infinities are not numbers here.
    """
    text = str(text).strip()
    if not _WHOLE_NUMBER.fullmatch(text):
        return None
    try:
        number = Decimal(text.replace(",", "").replace(_MINUS, "-"))
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def last_number(text: str) -> Decimal | None:
    """The last integer or decimal in a text.

    Args:
        text: a reply ("47 + 15 = 62." -> 62; "1.5e3" -> 1500; "\u22125" -> -5; a hyphen right
            after a digit separates two numbers: "3-5" -> 5).

    Returns:
        The number as a Decimal, or None when the text holds none.
    """
    found = _NUMBER.findall(str(text))
    if not found:
        return None
    return to_number(found[-1])


def score_output(output: str, expected: str, match: str = DEFAULT_MATCH, *,
                 timeout_s: float | None = None) -> bool:
    """Whether a reply answers the expected one under a match mode.

    Args:
        output: the model's reply (None counts as "").
        expected: the row's expected answer.
        match: one of MATCH_MODES (default "exact", Machine's usual mode). exact / prefix /
            contains: both sides go through `normalize()` first (so "Answer: 62." equals
            "answer: 62"). regex: `expected` must match the whole stripped raw output (fullmatch,
            the stricter reading: a pattern that should allow extra text says so with `.*`; `.`
            matches newlines). number: the last integer or decimal in the output (see
            `last_number()`) equals `expected` numerically ("62.0" == "62", "1e3" == "1000").
        timeout_s: the regex time bound (default None = patterns.REGEX_TIMEOUT_S, 1 s).

    Returns:
        True when the reply is right.

    Raises:
        ValueError: an unknown mode (the message names the known ones).
        patterns.RegexTimeout: a regex ran past its time bound.
    """
    output = "" if output is None else str(output)
    if match == "exact":
        return normalize(output) == normalize(expected)
    if match == "prefix":
        return normalize(output).startswith(normalize(expected))
    if match == "contains":
        return normalize(expected) in normalize(output)
    if match == "regex":
        return patterns.fullmatch(str(expected), output.strip(), timeout_s=timeout_s)
    if match == "number":
        got, want = last_number(output), to_number(str(expected))
        return got is not None and want is not None and got == want
    raise ValueError(f"unknown match mode: {match!r} (known: {', '.join(MATCH_MODES)})")


def format_matches(output: str, pattern: str | None, *, timeout_s: float | None = None) -> bool | None:
    """Whether a reply has the row's "format" (a regex that fullmatches the stripped raw output).

    Args:
        output: the model's reply (None counts as "").
        pattern: the row's "format" regex; None or "" when the row has none.
        timeout_s: as in score_output (default 1 s).

    Returns:
        True or False, or None when there is no pattern.

    Raises:
        patterns.RegexTimeout: the pattern ran past its time bound.
    """
    if not pattern:
        return None
    return patterns.fullmatch(pattern, ("" if output is None else str(output)).strip(), timeout_s=timeout_s)


def score_row(output: str, row: dict) -> tuple[bool, bool | None, str | None]:
    """Score one reply against a checked eval row; a regex past its time bound is not a hang.

    Args:
        output: the model's reply.
        row: an eval row as chat.check_row returns it ("expected", "match", "format").

    Returns:
        (correct, format_ok, why the row was not scored in full or None). A timed-out "regex"
        match counts as wrong; a timed-out "format" gives format_ok False.
    """
    problems = []
    try:
        correct = score_output(output, row["expected"], row["match"])
    except patterns.RegexTimeout as exc:
        correct = False
        problems.append(f"match 'regex' timed out, counted wrong: {exc}")
    try:
        format_ok = format_matches(output, row.get("format"))
    except patterns.RegexTimeout as exc:
        format_ok = False
        problems.append(f"'format' timed out, format_ok False: {exc}")
    return correct, format_ok, "; ".join(problems) or None


__all__ = ["MATCH_MODES", "DEFAULT_MATCH", "normalize", "to_number", "last_number", "score_output",
           "format_matches", "score_row"]
