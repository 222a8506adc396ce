"""The errors machine_nb raises on purpose: each says what is wrong, where, and what to do; and
`user_stacklevel`, which points the package's warnings at the user's line."""

from __future__ import annotations

import os
import sys


class MachineFormatError(ValueError):
    """A file of Machine's that cannot be read as it should: names the file, line and field.

    `line` is 1-based (None for whole-file JSON documents); `field` is a dotted path into the
    record (e.g. "scorecard.total") or None when the record itself is unreadable.
    """

    def __init__(self, path: str | os.PathLike | None, message: str, *, line: int | None = None,
                 field: str | None = None):
        self.path = None if path is None else os.fspath(path)
        self.line = line
        self.field = field
        self.reason = message
        where = self.path or "<data>"
        if line is not None:
            where += f":{line}"
        if field:
            where += f" (field {field!r})"
        super().__init__(f"{where}: {message}")


class BudgetExceeded(RuntimeError):
    """Refused before spending: the estimated cost is over the budget (`max_usd`) or unbounded."""


class EngineError(RuntimeError):
    """An engine cannot serve the request: no key, unreachable service, or a model it does not serve."""


class ValidationFailed(MachineFormatError):
    """Rows that validate() rejects, refused before training (validate.preflight).

    `result` is the ValidationResult with every finding; the message names the first of them.
    """

    def __init__(self, message: str, result: object, *, path: str | os.PathLike | None = None,
                 line: int | None = None):
        super().__init__(path, message, line=line)
        self.result = result


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """The `stacklevel` that points a warning at the first line outside machine_nb: the user's.

    Counted from the function that calls `warnings.warn`, past every frame of this package in
    between, so a warning names the notebook cell or script line that made the call however deep
    inside the package it was raised. Code running in a thread of the package's own (no user
    frame above it) gets the thread's entry point.
    """
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level
