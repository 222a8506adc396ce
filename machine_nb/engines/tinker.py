"""The Tinker engine: check, within seconds, that a key is set and the service answers.

The tinker SDK itself never fails fast: with a key but no network its calls retry for ~5 minutes
(measured: 300-350 s) before an APIConnectionError, and no timeout option is honoured. So every
path that hands work to the SDK (`engines.service_client("tinker")`, `sft(engine="tinker")`)
calls `check_tinker` first. Whether a run is worth its price is decided in pricing.py.
"""

from __future__ import annotations

import os
import threading
from urllib.parse import urlsplit

from ..errors import EngineError

#: Seconds the reachability check may take in all (DNS, connect, TLS, first response byte).
DEFAULT_TIMEOUT = 5.0


def tinker_base_url(base_url: str | None = None) -> str:
    """The service URL the SDK would use: `base_url`, else $TINKER_BASE_URL, else Tinker's prod URL."""
    try:
        from tinker.lib.base_url import resolve_base_url
    except ImportError:  # older SDKs: same rule, spelled out
        default = "https://tinker.thinkingmachines.dev/services/tinker-prod"
        return (base_url or os.environ.get("TINKER_BASE_URL") or default).rstrip("/")
    return resolve_base_url(base_url)


def _probe(url: str, timeout: float) -> None:
    """One HTTP(S) request to `url`; any HTTP response (even 404) means the service answers."""
    import http.client

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineError(f"Tinker base URL {url!r} is not an http(s) URL; fix TINKER_BASE_URL or base_url.")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("GET", parts.path or "/", headers={"User-Agent": "machine-nb-reachability"})
        conn.getresponse().read(256)
    finally:
        conn.close()


def check_tinker(base_url: str | None = None, timeout: float = DEFAULT_TIMEOUT, *,
                 api_key: str | None = None) -> str:
    """Raise EngineError unless a Tinker key is set and the service answers within `timeout` seconds.

    `base_url`: default None = $TINKER_BASE_URL, else Tinker's production URL (what the SDK uses).
    `timeout`: default 5 s for the whole check (name lookup, connect, TLS, first response), run in
    a daemon thread so even a stalled DNS lookup cannot hold the caller longer.
    `api_key`: default None = $TINKER_API_KEY. Its value is never printed or logged.
    Returns the base URL that answered.
    """
    key = api_key if api_key is not None else os.environ.get("TINKER_API_KEY", "")
    if not key.strip():
        raise EngineError(
            "TINKER_API_KEY is not set: export it (from the Tinker console) to train or sample on "
            "Tinker, or use engine='local' to run on this machine.")
    url = tinker_base_url(base_url)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            _probe(url, timeout)
            outcome.append(None)
        except BaseException as exc:  # reported to the caller below
            outcome.append(exc)

    worker = threading.Thread(target=run, name="machine-nb-tinker-check", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        raise EngineError(
            f"Tinker at {url} did not answer within {timeout:g} s (no network, a firewall, or a "
            "wrong TINKER_BASE_URL); not starting the SDK, whose calls would retry for ~5 minutes. "
            "Use engine='local' to run on this machine.")
    exc = outcome[0]
    if isinstance(exc, EngineError):
        raise exc
    if exc is not None:
        reason = type(exc).__name__ + (f": {exc}" if str(exc) else "")
        raise EngineError(
            f"Tinker at {url} did not answer within {timeout:g} s ({reason}); not starting the SDK, "
            "whose calls would retry for ~5 minutes. Use engine='local' to run on this machine.") from None
    return url


def service_client(base_url: str | None = None, timeout: float = DEFAULT_TIMEOUT, **kwargs):
    """A real `tinker.ServiceClient`, after `check_tinker` (same `base_url`, `timeout`) passes."""
    url = check_tinker(base_url, timeout, api_key=kwargs.get("api_key"))
    import tinker

    return tinker.ServiceClient(base_url=url, **kwargs)
