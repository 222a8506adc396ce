"""A check after every test's teardown (tests/conftest.py runs it): no tinker SDK session is left sending
heartbeats to a server that is gone.

Such a session fails a heartbeat every 10 s for the life of the process, and after two minutes the
SDK logs "Session heartbeat failed … Tinker is down" every 10 s: in a notebook, under a later cell's
output. A local server stopping in this process ends the heartbeats sent to it, and the product drops
the clients it keeps when its watchdog sees their server die; a server in another process that
a test kills or stops leaves the heartbeats of the test's own clients to the test.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import pytest

from machine_nb.engines.local.workarounds import sdk_heartbeats, stop_heartbeats_to


def _answers(url: str) -> bool:
    """Whether something accepts connections at `url`'s host and port."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=1):
            return True
    except OSError:
        return False


def orphaned_heartbeats(wait: float = 5.0) -> list[str]:
    """The URLs of servers that are gone yet still get SDK heartbeats, after up to `wait` seconds
    for clients being dropped in the background (a watchdog's) to stop theirs."""
    deadline = time.monotonic() + wait
    while True:
        dead = [(url, task) for url, task in sdk_heartbeats() if not _answers(url)]
        if not dead or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    gone = sorted({url for url, _ in dead})
    for url in gone:  # stop them, so they do not warn under later tests
        stop_heartbeats_to(url)
    return gone


def check_no_heartbeat_left() -> None:
    """Fail (the teardown of the test just ended, its module's fixtures included) when a server
    that is gone still gets SDK heartbeats; they are stopped either way."""
    gone = orphaned_heartbeats()
    if gone:
        pytest.fail(f"an SDK session still sends heartbeats to {', '.join(gone)}, which is gone: "
                    "close the client (or let the product drop it) before its server stops", pytrace=False)
