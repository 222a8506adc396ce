"""Old names that keep working for one release: a keyword renamed in the public API is still
accepted, with a DeprecationWarning naming the new one, so notebooks written against an earlier
release run unchanged while they are updated.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # machine_nb/


def user_stacklevel() -> int:
    """The `stacklevel` that points a warning at the first line outside machine_nb: the user's.

    Counted from the function that calls `warnings.warn`, past every frame of this package in
    between (helpers, a `renamed` wrapper), so a warning names the notebook cell or script line
    that made the call however deep inside the package it was raised. Code running in a thread of
    the package's own (no user frame above it) gets the thread's entry point.
    """
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def renamed(**old_to_new: str) -> Callable[[F], F]:
    """Accept old keyword names for a function's renamed parameters.

    Args:
        **old_to_new: old keyword name -> the parameter's name now.

    Returns:
        A decorator. The wrapped function takes the old keyword too, warns (DeprecationWarning,
        at the caller's line) and passes the value on under the new name; giving both names is a
        TypeError.
    """
    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__name__}() got both {old!r} and {new!r}: {old!r} is the old "
                                        f"name of {new!r}, pass only {new!r}")
                    warnings.warn(f"{fn.__name__}({old}=…) is now {fn.__name__}({new}=…); the old name "
                                  "will be removed in a later release", DeprecationWarning, stacklevel=user_stacklevel())
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        wrapper.__renamed__ = dict(old_to_new)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def deprecated_alias(name: str, new: str) -> None:
    """Warn that `name` is now `new` (DeprecationWarning at the user's line)."""
    warnings.warn(f"{name} is now {new}; the old name will be removed in a later release",
                  DeprecationWarning, stacklevel=user_stacklevel())
