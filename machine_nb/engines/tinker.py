"""The Tinker engine: check, within seconds, that a key is set and the service answers as Tinker.

The tinker SDK itself never fails fast: with a key but no network (or a server that answers
500) its calls retry for about five minutes before an error, and no timeout option
is honoured. So every path that hands work to the SDK on Tinker (`engines.service_client("tinker")`,
`sft(engine="tinker")`, `evaluate(engine="tinker")`) calls `check_tinker` first: a health check
that must answer `{"status": "ok"}` and a capabilities listing that must be Tinker's shape. While
work runs, `Watchdog` keeps checking, and counts the 5xx answers to the SDK's work calls
(`WorkCalls`), so a service that dies mid-run, or answers its checks but fails its work, fails
the call within seconds instead of minutes. Whether a run is worth its price is decided in pricing.py.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Callable, Iterable
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


#: What a hidden query value shows as (as core.redact writes a redacted value).
_HIDDEN = "[redacted]"


def _query_names(query: str) -> list[str]:
    """The parameter names of a URL's query; a part without "=" (a bare token) as `[redacted]`."""
    return [name if sep else _HIDDEN for name, sep, _ in (part.partition("=") for part in query.split("&") if part)]


def shown_url(url: str | None) -> str | None:
    """A service URL as a message or a file may show it: without its userinfo (`user:token@`) or
    fragment, each query value `[redacted]`. Calls connect with the URL as given.

    Args:
        url: the URL (None: None).

    Returns:
        `https://gateway.example/tinker` for `https://user:token@gateway.example/tinker`.
    """
    if not url:
        return url
    from urllib.parse import urlunsplit

    parts = urlsplit(str(url))
    query = "&".join(name if name == _HIDDEN else f"{name}={_HIDDEN}" for name in _query_names(parts.query))
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, query, ""))


def check_base_url(url: str) -> None:
    """Refuse a Tinker base URL with a query or fragment, naming the parameters, never their values.

    The SDK appends its API paths to the base URL as text, so `…?api_key=…` would put every call's
    path after the query: each would reach the service's root and fail.

    Args:
        url: the resolved base URL (engines.base_url).

    Raises:
        EngineError: a query or fragment in it.
    """
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        names = ", ".join(_query_names(parts.query)) or "a fragment"
        raise EngineError(f"the Tinker base URL {shown_url(url)} carries a query ({names}): the SDK appends its API "
                          "paths to it, so every call would miss. Give base_url (or TINKER_BASE_URL) without "
                          "'?…', and the Tinker key in TINKER_API_KEY.")


def _request(method: str, url: str, path: str, timeout: float, key: str | None = None,
             payload: dict | None = None) -> tuple[int, bytes]:
    """One GET, or one POST of `payload` as JSON (default an empty object), to `url` + `path`; (status,
    first 64 kB of the body). A user and password in the URL go as Basic auth, as the SDK's HTTP client sends them (a
    gateway in front of the service may ask for them on every request)."""
    import base64
    import http.client
    from urllib.parse import unquote

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineError(f"Tinker base URL {shown_url(url)!r} is not an http(s) URL; fix TINKER_BASE_URL or base_url.")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    headers = {"User-Agent": "machine-nb-check"}
    if parts.username is not None or parts.password is not None:
        pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
    if key:
        headers["X-API-Key"] = key
    body = None
    if method == "POST":
        headers["Content-Type"], body = "application/json", json.dumps(payload or {}).encode("utf-8")
    try:
        conn.request(method, parts.path.rstrip("/") + path, body=body, headers=headers)
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
    status, body = _request("GET", url, "/api/v1/healthz", timeout)
    health = _json(body)
    if status != 200 or not isinstance(health, dict) or health.get("status") != "ok":
        snippet = body[:120].decode("utf-8", "replace").strip()
        raise EngineError(f"{shown_url(url)} is not answering as Tinker: its health check /api/v1/healthz gave HTTP "
                          f"{status} {snippet!r} (expected {{\"status\": \"ok\"}}); check TINKER_BASE_URL.")
    status, body = _request("GET", url, "/api/v1/get_server_capabilities", timeout, key)
    if status in (401, 403):
        raise EngineError(f"{shown_url(url)} refused the API key (HTTP {status}): check TINKER_API_KEY.")
    caps = _json(body)
    if status != 200 or not isinstance(caps, dict) or not isinstance(caps.get("supported_models"), list):
        raise EngineError(f"{shown_url(url)} is not answering as Tinker: /api/v1/get_server_capabilities gave HTTP {status}.")
    return [str(m.get("model_name")) for m in caps["supported_models"] if isinstance(m, dict)]


def _in_thread(fn: Callable[[], Any], name: str) -> tuple[threading.Thread, list]:
    """Start fn() in a daemon thread (one the caller can give up on); the list gets (True, its
    result) or (False, its exception) when it ends."""
    outcome: list = []

    def call() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller through `outcome`
            outcome.append((False, exc))

    worker = threading.Thread(target=call, name=name, daemon=True)
    worker.start()
    return worker, outcome


def _bounded(fn, timeout: float, what: str, url: str):
    """Run fn() in a daemon thread, so even a stalled DNS lookup cannot hold the caller longer."""
    worker, outcome = _in_thread(fn, "machine-nb-tinker-check")
    worker.join(timeout)
    ok, value = outcome[0] if outcome else (False, TimeoutError())
    if ok:
        return value
    if isinstance(value, EngineError):
        raise value
    if isinstance(value, TimeoutError):  # ours, or the socket's own a moment before it
        raise EngineError(
            f"Tinker at {shown_url(url)} did not answer within {timeout:g} s (no network, a firewall, or a wrong "
            f"TINKER_BASE_URL); not {what}, since the SDK would retry for ~5 minutes. "
            "Use engine='local' to run on this machine.") from None
    reason = type(value).__name__ + (f": {value}" if str(value) else "")
    raise EngineError(f"Tinker at {shown_url(url)} did not answer ({reason}); not {what}, since the SDK would retry "
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
            raise EngineError(f"{model!r} is the local engine's model and {shown_url(url)} does not serve it: pass "
                              "engine='local', or point TINKER_BASE_URL at a `machine-nb serve` server.")
    return url


def session_gone(url: str, session_id: str, timeout: float = DEFAULT_TIMEOUT, key: str | None = None) -> bool:
    """Whether the service at `url` says it has no session `session_id`, or that it has finished
    (a heartbeat for it answered 404 or 410): a server restarted since the session was opened, or
    one that ended it. False for any other answer, or none within `timeout` s (nothing is known)."""
    worker, outcome = _in_thread(lambda: _request("POST", url, "/api/v1/session_heartbeat", timeout, key,
                                                  {"session_id": session_id}), "machine-nb-session-check")
    worker.join(timeout)
    if not outcome or not outcome[0][0]:
        return False
    return outcome[0][1][0] in (404, 410)


#: Paths of the checks every service answers; the SDK's other calls are its work.
_CHECK_PATHS = ("/api/v1/healthz", "/api/v1/get_server_capabilities")


class WorkCalls(logging.Filter):
    """Counts the answers the SDK gets to its work calls on one service, as httpx (the SDK's HTTP
    client) logs each of them ("HTTP Request: POST <url> "HTTP/1.1 500 …"" on the `httpx` logger).

    Watching the log is how a half-dead service is seen (its health check and capabilities
    answer, its work calls answer 5xx, which the SDK retries for ~5 minutes): the SDK takes no
    HTTP client or event hooks through its public constructor, and nothing of it is patched.
    While a watch runs the `httpx` logger's level is lowered to INFO; records below the level it
    had are counted and then dropped, so no handler sees more than it did.

    Use as a context manager; `failing()` says which calls answered 5xx how often since the last
    work call that succeeded.
    """

    _lock = threading.Lock()
    _active: list["WorkCalls"] = []
    _saved_level: int | None = None  # the httpx logger's effective level before the first watch
    _restore: int | None = None  # its own level, when the first watch changed it

    def __init__(self, url: str):
        super().__init__()
        self.url = url.rstrip("/")
        self.failures: dict[str, int] = {}  # "POST /api/v1/…" -> 5xx answers since the last success
        self.first_failure: float | None = None  # monotonic time of the first of them
        self.last_ok: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:  # noqa: A003  (logging's name)
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and str(record.msg).startswith("HTTP Request:"):
            for watch in list(WorkCalls._active):
                watch.saw(str(args[0]), str(args[1]), args[3])
        return record.levelno >= (WorkCalls._saved_level or logging.WARNING)

    def saw(self, method: str, url: str, status: Any) -> None:
        """Count one answer (method, full URL, HTTP status)."""
        # this service's own URL, or one under it: `…:80` is not `…:8000`, nor `/tinker` `/tinker-dev`
        if not isinstance(status, int) or not (url == self.url or url.startswith(self.url + "/")):
            return
        path = urlsplit(url).path
        if any(path.endswith(p) for p in _CHECK_PATHS):
            return
        if status >= 500:
            key = f"{method} {path[len(urlsplit(self.url).path):] or path}"
            self.failures[key] = self.failures.get(key, 0) + 1
            if self.first_failure is None:
                self.first_failure = time.monotonic()
        else:
            self.failures.clear()
            self.first_failure = None
            self.last_ok = time.monotonic()

    def cleared(self, call: str) -> None:
        """Forget the 5xx answers counted for `call` alone ("POST /api/v1/client/config"), as after
        a success of that call that says nothing of the others."""
        self.failures.pop(call, None)
        if not self.failures:
            self.first_failure = None

    def failing(self) -> tuple[int, float, str]:
        """(5xx answers since the last success, seconds since the first of them, which calls how
        often: "POST /api/v1/create_session answered HTTP 5xx 6 times")."""
        counts = dict(self.failures)
        n = sum(counts.values())
        if not n or self.first_failure is None:
            return 0, 0.0, ""
        said = ", ".join(f"{call} answered HTTP 5xx {k} time{'s' if k != 1 else ''}"
                         for call, k in sorted(counts.items(), key=lambda kv: -kv[1]))
        return n, time.monotonic() - self.first_failure, said

    def __enter__(self) -> "WorkCalls":
        log = logging.getLogger("httpx")
        with WorkCalls._lock:
            if not WorkCalls._active:
                WorkCalls._saved_level = log.getEffectiveLevel()
                log.addFilter(WORK_CALLS_FILTER)
                if log.level == logging.NOTSET or log.level > logging.INFO:
                    WorkCalls._restore = log.level
                    log.setLevel(logging.INFO)
            WorkCalls._active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        log = logging.getLogger("httpx")
        with WorkCalls._lock:
            if self in WorkCalls._active:
                WorkCalls._active.remove(self)
            if not WorkCalls._active:
                log.removeFilter(WORK_CALLS_FILTER)
                restore = getattr(WorkCalls, "_restore", None)
                if restore is not None:
                    log.setLevel(restore)
                    WorkCalls._restore = None
                WorkCalls._saved_level = None


class _Dispatch(WorkCalls):
    """The one filter on the `httpx` logger: it hands each record to every active watch."""

    def __init__(self) -> None:
        super().__init__("")


WORK_CALLS_FILTER = _Dispatch()


def _forget_watches_in_child() -> None:
    """In a forked child the parent's watches are not this process's (their watchdog threads did not
    come along), and the lock may have been held by a thread that did not either: the child starts
    with a fresh lock, no watch, and the `httpx` logger as it was before the parent's first watch."""
    WorkCalls._lock = threading.Lock()
    if WorkCalls._active:
        WorkCalls._active = []
        log = logging.getLogger("httpx")
        log.removeFilter(WORK_CALLS_FILTER)
        if WorkCalls._restore is not None:
            log.setLevel(WorkCalls._restore)
        WorkCalls._restore = WorkCalls._saved_level = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_watches_in_child)


class Watchdog:
    """Checks a service's health every `every` seconds while work runs on it, and watches the
    answers to the SDK's work calls (WorkCalls).

    `failed` becomes the reason once the service has not answered for `grace` seconds (default
    10), or once its work calls have answered 5xx at least `max_5xx` times (default 4) over at
    least `grace_5xx` seconds (default 10) with no success between (a half-dead service: its
    health check answers, its work fails). A caller polling it stops the work and raises
    EngineError well within 30 s, where the SDK alone would retry for ~5 minutes.
    """

    def __init__(self, url: str, *, every: float = 2.0, grace: float = 10.0, timeout: float = 3.0,
                 max_5xx: int = 4, grace_5xx: float = 10.0, probe_work: bool = True,
                 on_failed: Callable[[str], None] | None = None):
        self.url, self.every, self.grace, self.timeout = url, every, grace, timeout
        self.max_5xx, self.grace_5xx = max_5xx, grace_5xx
        # work calls made in another process (sft's training process) are not seen here: a
        # light work call of this process's own (the SDK's client-config request) stands in
        self.probe_work = probe_work
        self.on_failed = on_failed  # called with the URL once the work stopped on a dead service
        self.failed: str | None = None
        self.work = WorkCalls(url)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="machine-nb-watchdog", daemon=True)

    def __enter__(self) -> "Watchdog":
        self.work.__enter__()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.work.__exit__()
        if self.failed and self.on_failed is not None:
            # in the background: a call given up on (run) may still hold the SDK client's locks
            threading.Thread(target=self.on_failed, args=(self.url,), name="machine-nb-drop-clients",
                             daemon=True).start()

    def _run(self) -> None:
        last_ok = time.monotonic()
        while not self._stop.wait(min(self.every, 0.5)):
            n, for_s, said = self.work.failing()
            if n >= self.max_5xx and for_s >= self.grace_5xx:
                self.failed = (f"the service at {shown_url(self.url)} answers its health check but fails its work: {said}, "
                               f"over {for_s:.0f} s with no success (the SDK would retry for ~5 minutes)")
                return
            if time.monotonic() - last_ok < self.every:
                continue
            try:
                status, _ = _request("GET", self.url, "/api/v1/healthz", self.timeout)
                if status == 200:
                    last_ok = time.monotonic()
                    if self.probe_work:
                        self._probe()
                    continue
                why = f"its health check answered HTTP {status}"
            except Exception as exc:  # connection refused, reset, timeout
                why = f"{type(exc).__name__}: {exc}"
            if time.monotonic() - last_ok >= self.grace:
                self.failed = f"the service at {shown_url(self.url)} stopped answering for {self.grace:g} s ({why})"
                return

    def _probe(self) -> None:
        """One light work call (the client-config request the SDK makes first). A 5xx answer is
        counted as the SDK's own are; any answer below 500 (a refusal of this bare request included)
        clears only its own count: it says that call works, not that the SDK's heavier ones (a
        forward/backward answering 5xx) do. Never raises."""
        try:
            status, _ = _request("POST", self.url, "/api/v1/client/config", self.timeout, os.environ.get("TINKER_API_KEY"))
        except Exception:  # the health check says whether the service answers at all
            return
        if status >= 500:
            self.work.saw("POST", f"{self.url.rstrip('/')}/api/v1/client/config", status)
        else:
            self.work.cleared("POST /api/v1/client/config")

    def check(self) -> None:
        """Raise EngineError if the service has stopped answering."""
        if self.failed:
            raise EngineError(self.failed)

    def run(self, fn: Callable[[], Any], poll_s: float = 0.2) -> Any:
        """fn() (a blocking SDK call, such as opening a sampler), given up with EngineError once
        the service is found failing (the call's thread is left to the SDK, whose client is
        dropped on leaving the watchdog)."""
        worker, outcome = _in_thread(fn, "machine-nb-watched-call")
        while not outcome:
            worker.join(poll_s)
            if not outcome and self.failed:
                raise EngineError(self.failed)
        ok, value = outcome[0]
        if ok:
            return value
        raise value
