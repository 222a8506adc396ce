"""The Tinker engine: check, within seconds, that a key is set and the service answers as Tinker.

The tinker SDK itself never fails fast: with a key but no network (or a server that answers
500) its calls retry for ~5 minutes (measured: 300-350 s) before an error, and no timeout option
is honoured. So every path that hands work to the SDK on Tinker (`engines.service_client("tinker")`,
`sft(engine="tinker")`, `evaluate(engine="tinker")`) calls `check_tinker` first: a health check
that must answer `{"status": "ok"}` and a capabilities listing that must be Tinker's shape. While
work runs, `Watchdog` keeps checking, so a service that dies mid-run fails the call within
seconds instead of minutes. Whether a run is worth its price is decided in pricing.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Callable, Iterable
from urllib.parse import urlsplit

from ..errors import EngineError

#: Seconds the reachability check may take in all (DNS, connect, TLS, both answers).
DEFAULT_TIMEOUT = 5.0
_PROD_URL = "https://tinker.thinkingmachines.dev/services/tinker-prod"


def tinker_base_url(base_url: str | None = None) -> str:
    """The service URL the SDK would use: `base_url`, else $TINKER_BASE_URL, else Tinker's prod URL."""
    try:
        from tinker.lib.base_url import resolve_base_url
    except ImportError:  # older SDKs: same rule, spelled out
        return (base_url or os.environ.get("TINKER_BASE_URL") or _PROD_URL).rstrip("/")
    return resolve_base_url(base_url)


def _get(url: str, path: str, timeout: float, key: str | None = None) -> tuple[int, bytes]:
    """One GET; (status, first 64 kB of the body)."""
    import http.client

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineError(f"Tinker base URL {url!r} is not an http(s) URL; fix TINKER_BASE_URL or base_url.")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    headers = {"User-Agent": "machine-nb-check"}
    if key:
        headers["X-API-Key"] = key
    try:
        conn.request("GET", parts.path.rstrip("/") + path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read(65536)
    finally:
        conn.close()


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def probe(url: str, timeout: float, key: str | None) -> list[str]:
    """Check that `url` answers as a Tinker service; returns the model names it lists.

    Raises EngineError saying what it answered instead (an HTTP error, a page that is not
    Tinker's health answer, a refused key).
    """
    status, body = _get(url, "/api/v1/healthz", timeout)
    health = _json(body)
    if status != 200 or not isinstance(health, dict) or health.get("status") != "ok":
        snippet = body[:120].decode("utf-8", "replace").strip()
        raise EngineError(f"{url} is not answering as Tinker: its health check /api/v1/healthz gave HTTP "
                          f"{status} {snippet!r} (expected {{\"status\": \"ok\"}}); check TINKER_BASE_URL.")
    status, body = _get(url, "/api/v1/get_server_capabilities", timeout, key)
    if status in (401, 403):
        raise EngineError(f"{url} refused the API key (HTTP {status}): check TINKER_API_KEY.")
    caps = _json(body)
    if status != 200 or not isinstance(caps, dict) or not isinstance(caps.get("supported_models"), list):
        raise EngineError(f"{url} is not answering as Tinker: /api/v1/get_server_capabilities gave HTTP {status}.")
    return [str(m.get("model_name")) for m in caps["supported_models"] if isinstance(m, dict)]


def _bounded(fn, timeout: float, what: str, url: str):
    """Run fn() in a daemon thread, so even a stalled DNS lookup cannot hold the caller longer."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller below
            outcome.append((False, exc))

    worker = threading.Thread(target=run, name="machine-nb-tinker-check", daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        raise EngineError(
            f"Tinker at {url} did not answer within {timeout:g} s (no network, a firewall, or a wrong "
            f"TINKER_BASE_URL); not {what}, since the SDK would retry for ~5 minutes. "
            "Use engine='local' to run on this machine.")
    ok, value = outcome[0]
    if ok:
        return value
    if isinstance(value, EngineError):
        raise value
    if isinstance(value, TimeoutError):  # the socket's own timeout, a moment before ours
        raise EngineError(
            f"Tinker at {url} did not answer within {timeout:g} s (no network, a firewall, or a wrong "
            f"TINKER_BASE_URL); not {what}, since the SDK would retry for ~5 minutes. "
            "Use engine='local' to run on this machine.") from None
    reason = type(value).__name__ + (f": {value}" if str(value) else "")
    raise EngineError(f"Tinker at {url} did not answer ({reason}); not {what}, since the SDK would retry "
                      "for ~5 minutes. Use engine='local' to run on this machine.") from None


def check_tinker(base_url: str | None = None, timeout: float = DEFAULT_TIMEOUT, *,
                 api_key: str | None = None, models: Iterable[str] = ()) -> str:
    """Raise EngineError unless a key is set and the service answers as Tinker within `timeout` s.

    Args:
        base_url: default None = $TINKER_BASE_URL, else Tinker's production URL (what the SDK uses).
        timeout: default 5 s for the whole check (name lookup, connect, TLS, both answers).
        api_key: default None = $TINKER_API_KEY. Its value is never printed or logged.
        models: models the run needs; a local model (`local/…`) must be listed by the service
            (a `machine-nb serve` server lists its own), Tinker's own names are not checked here.
    Returns:
        The base URL that answered.
    """
    key = api_key if api_key is not None else os.environ.get("TINKER_API_KEY", "")
    if not key.strip():
        raise EngineError(
            "TINKER_API_KEY is not set: export it (from the Tinker console) to train or sample on "
            "Tinker, or use engine='local' to run on this machine.")
    url = tinker_base_url(base_url)
    listed = _bounded(lambda: probe(url, timeout, key), timeout, "starting the SDK", url)
    for model in models:
        name = str(model).split(":", 1)[0]
        if name.startswith("local/") and name not in listed:
            raise EngineError(f"{model!r} is the local engine's model and {url} does not serve it: pass "
                              "engine='local', or point TINKER_BASE_URL at a `machine-nb serve` server.")
    return url


class Watchdog:
    """Checks a service's health every `every` seconds while work runs on it.

    `failed` becomes the reason once it has not answered for `grace` seconds (default 10), so a
    caller polling it can stop the work and raise EngineError well within 30 s of the service
    going away, where the SDK alone would retry for ~5 minutes.
    """

    def __init__(self, url: str, *, every: float = 2.0, grace: float = 10.0, timeout: float = 3.0,
                 on_failed: Callable[[str], None] | None = None):
        self.url, self.every, self.grace, self.timeout = url, every, grace, timeout
        self.on_failed = on_failed  # called with the URL once the work stopped on a dead service
        self.failed: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="machine-nb-watchdog", daemon=True)

    def __enter__(self) -> "Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.failed and self.on_failed is not None:
            self.on_failed(self.url)

    def _run(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.wait(self.every):
            try:
                status, _ = _get(self.url, "/api/v1/healthz", self.timeout)
                if status == 200:
                    last_ok = time.monotonic()
                    continue
                why = f"its health check answered HTTP {status}"
            except Exception as exc:  # connection refused, reset, timeout
                why = f"{type(exc).__name__}: {exc}"
            if time.monotonic() - last_ok >= self.grace:
                self.failed = f"the service at {self.url} stopped answering for {self.grace:g} s ({why})"
                return

    def check(self) -> None:
        """Raise EngineError if the service has stopped answering."""
        if self.failed:
            raise EngineError(self.failed)
