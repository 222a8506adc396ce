"""The regular expressions eval rows carry (`"match": "regex"`, `"format"`), compiled and matched with a
time bound, so one pathological pattern such as `(a|aa)+$` cannot hang an eval.

Python's `re` cannot be interrupted (it holds the GIL until the match ends, hours for such a
pattern); the `regex` package, in its `re`-compatible mode (VERSION0), checks a timeout while it
matches. validate.py and evaluate.py both compile through here, so a pattern validate accepts is
one evaluate can run. What a timed-out row scores is decided in evaluate.py.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

REGEX_TIMEOUT_S = 1.0
"""Longest one match may run, in seconds. An answer-sized output matches in microseconds; only
catastrophic backtracking comes near this (the check is periodic, so a match may overrun it a little)."""


class RegexTimeout(TimeoutError):
    """A pattern ran past its time bound on one text (catastrophic backtracking).

    Args:
        pattern: the pattern (kept as `.pattern`; the message shows its first 60 characters).
        timeout_s: the bound it ran past, in seconds (kept as `.timeout_s`).
    """

    def __init__(self, pattern: str, timeout_s: float) -> None:
        self.pattern, self.timeout_s = pattern, timeout_s
        shown = pattern if len(pattern) <= 60 else pattern[:57] + "…"
        super().__init__(f"the regex {shown!r} ran past its {timeout_s:g} s bound (catastrophic backtracking?)")


def pattern_error() -> type[Exception]:
    """The exception class an invalid pattern raises, for an `except` clause.

    Returns:
        `regex.error` (a ValueError-like error with a position); `regex` loads on this call.
    """
    import regex

    return regex.error


@lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> Any:
    """A pattern compiled as eval rows use it, cached.

    Args:
        pattern: the regular expression (Python `re` syntax).

    Returns:
        The compiled pattern (DOTALL: `.` matches newlines too).

    Raises:
        pattern_error(): the pattern is invalid.
        TypeError: `pattern` is not a string.
    """
    import regex

    if not isinstance(pattern, str):
        raise TypeError(f"a pattern must be a string, got {type(pattern).__name__}")
    return regex.compile(pattern, flags=regex.DOTALL | regex.VERSION0)


def fullmatch(pattern: str, text: str, *, timeout_s: float | None = None) -> bool:
    """Whether `pattern` matches the whole of `text`, within a time bound.

    Args:
        pattern: the regular expression (compiled with compile_pattern).
        text: the text to match.
        timeout_s: the bound in seconds (default None: REGEX_TIMEOUT_S).

    Returns:
        True when the pattern matches all of the text.

    Raises:
        RegexTimeout: the match ran past the bound.
    """
    bound = REGEX_TIMEOUT_S if timeout_s is None else float(timeout_s)
    try:
        return compile_pattern(pattern).fullmatch(text, timeout=bound) is not None
    except TimeoutError:
        raise RegexTimeout(pattern, bound) from None
