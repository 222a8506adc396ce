"""The local engine as a server that speaks Tinker's HTTP API, so the real `tinker` SDK runs here.

`machine-nb serve` (or `LocalServer(...).start()`) answers every request the SDK makes for
training clients, sampling clients, futures and the REST lookups tinker-cookbook uses, with the
SDK's own request and response types: JSON bodies, except forward/backward requests and the
results of forward/backward and sampling, which are protobuf (wire.py). The work itself runs in
compute.py (one worker thread per training run, executing its requests in `seq_id` order, so
different runs' steps run in parallel, and one per sampler); loss functions are losses.py's; checkpoints live under the data dir (checkpoints.py).

Things a Tinker client relies on, and how they are met here:
- futures are polled with `retrieve_future` and the SDK re-polls at once, so a poll that is not
  ready is held open (long-poll) for up to `LONG_POLL_S` seconds before a "try_again" (an HTTP 408
  with the try_again body, which the SDK retries silently);
- the SDK retries 5xx answers and dropped connections for about five minutes, so every error
  this server means (bad input, unknown model, a request it does not support) is a 4xx with a
  JSON body naming the call and field, or a failed future (`{"error", "category"}`), both of
  which the SDK raises at once;
- telemetry is accepted and dropped (a 5xx there delays every SDK error by ~30 s).
Every request must send the server's key as its API key (`X-API-Key`), checked before anything
else of the request is read (401 otherwise; only the health check answers without it): the key
is random per server unless one is given (`machine-nb serve` takes it from a file, the
environment, or the data dir's own key file), so no other user of the machine can reach the runs
through the loopback port. The server never stores or logs the key a client sends. Requests are
framed by uvicorn (a maintained HTTP stack: chunked bodies, bad lengths); SIGINT and SIGTERM stop
`serve()` cleanly, answering the requests in progress first.
"""

from __future__ import annotations

import collections
import errno
import hmac
import ipaddress
import json
import logging
import math
import os
import secrets
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import parse_qs

from ...errors import EngineError, MachineFormatError
from . import checkpoints as ck

if TYPE_CHECKING:
    import asyncio

logger = logging.getLogger(__name__)

#: Seconds a `retrieve_future` poll is held open before "try_again" (the SDK's read timeout is 45 s).
LONG_POLL_S = 20.0
#: Largest request body accepted (the SDK splits forward/backward batches at ~5 MB).
MAX_BODY_BYTES = 64 * 1024 * 1024
#: Requests of one run queued ahead of the next one to run at most (a `seq_id` beyond is refused).
SEQ_WINDOW = 4096
#: Seconds a request waits for an earlier `seq_id` of its run that never arrives before failing.
SEQ_GAP_TIMEOUT_S = 120.0
#: Seconds a finished future's result is kept for a client that polls again (a retried poll).
FUTURE_TTL_S = 600.0
#: Seconds after a session's last heartbeat (the SDK sends one every 10 s) before its training
#: runs and samplers are let go: a long notebook session would otherwise keep every model it trained.
SESSION_TTL_S = 300.0
#: Requests a client sends while idle (not work: `busy()` leaves them out).
_HOUSEKEEPING = frozenset({"/api/v1/healthz", "/api/v1/session_heartbeat", "/api/v1/telemetry",
                           "/api/v1/client/dynamic_config"})
#: Requests with a protobuf body, and the JSON ones that carry a training run's `seq_id`.
_PROTOBUF_CALLS = frozenset({"/api/v1/forward_backward", "/api/v1/forward"})
_ORDERED_CALLS = frozenset({"/api/v1/optim_step", "/api/v1/save_weights", "/api/v1/save_weights_for_sampler",
                            "/api/v1/load_weights"})
#: Seconds since its last request during which a run counts as training now, when a new run is
#: placed (in this process or a training process, workers.py): a script's steps come faster.
ACTIVE_S = 2.0
#: Samplers kept at most, the least recently used let go first (each holds a copy of its model),
#: and the seconds an unused one is kept.
MAX_SAMPLERS = 64
SAMPLER_IDLE_S = 1800.0
#: Samples one `asample` request may ask for at most: the request's checks and its reply grow
#: with the count, so a larger one is refused before anything is built for it.
MAX_NUM_SAMPLES = 4096
#: Seeds a request may give: what torch's generators take (a signed 64-bit number).
SEED_RANGE = range(-(2**63), 2**63)


class ApiError(Exception):
    """An answer other than 200: `status`, a message, and the request field it is about."""

    def __init__(self, status: int, message: str, field: str | None = None, **extra: Any):
        super().__init__(message)
        self.status, self.message, self.field, self.extra = status, message, field, extra


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------
# futures


@dataclass
class _Future:
    request_id: str
    call: str
    done: threading.Event = field(default_factory=threading.Event)
    content_type: str = "application/json"
    body: bytes = b""
    finished_at: float | None = None
    polls: int = 0  # retrieve_future requests for it (long-polling keeps this near 1 per LONG_POLL_S waited)
    owner: "_Futures | None" = field(default=None, repr=False)


class _Futures:
    """request id -> result (JSON or protobuf bytes), waited on by long-polls. A result is kept
    FUTURE_TTL_S after it finished; the oldest go first, so a new request costs the same however
    many results a long session keeps (a scan of them all per request grew with every row evaluated)."""

    def __init__(self) -> None:
        self._items: dict[str, _Future] = {}
        self._finished: collections.deque[_Future] = collections.deque()  # in the order they finished
        self._lock = threading.Lock()

    def new(self, call: str) -> _Future:
        fut = _Future(f"req-{secrets.token_hex(8)}", call, owner=self)
        with self._lock:
            self._gc()
            self._items[fut.request_id] = fut
        return fut

    def _gc(self) -> None:
        cutoff = time.monotonic() - FUTURE_TTL_S
        while self._finished and self._finished[0].finished_at < cutoff:
            self._items.pop(self._finished.popleft().request_id, None)

    def _finish(self, fut: _Future) -> None:
        with self._lock:
            self._finished.append(fut)

    def get(self, request_id: str) -> _Future | None:
        with self._lock:
            return self._items.get(request_id)

    def of_call(self, call: str) -> list[_Future]:
        """The futures of one kind of call still kept (e.g. "asample"), oldest first."""
        with self._lock:
            return [f for f in self._items.values() if f.call == call]

    @staticmethod
    def resolve(fut: _Future, body: bytes, content_type: str = "application/json") -> None:
        fut.body, fut.content_type = body, content_type
        if fut.finished_at is None:  # kept FUTURE_TTL_S from its first result
            fut.finished_at = time.monotonic()
            if fut.owner is not None:
                fut.owner._finish(fut)
        fut.done.set()

    @classmethod
    def resolve_json(cls, fut: _Future, value: Any) -> None:
        cls.resolve(fut, json.dumps(value).encode("utf-8"))

    @classmethod
    def fail(cls, fut: _Future, message: str, category: str = "user") -> None:
        cls.resolve_json(fut, {"error": message, "category": category})


def _os_problem(exc: OSError) -> str:
    """What the file system refused, naming the file, and the way out when the disk is full."""
    what = exc.strerror or str(exc)
    if exc.filename is not None:
        what += f": {exc.filename}"
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        what += " (the disk holding the data dir is full: free some space, or serve from another data dir)"
    return what


def _run_job(fut: _Future, fn: Callable[[], tuple[bytes, str] | Any]) -> None:
    """Run one job and resolve its future: JSON-able values, (bytes, content type), or an error."""
    try:
        value = fn()
    except (EngineError, MachineFormatError, ValueError) as exc:
        _Futures.fail(fut, f"{fut.call}: {exc}", "user")
    except OSError as exc:  # the file system's refusal (a full disk, a folder not writable), not a defect
        logger.warning("local server: %s failed: %s", fut.call, _os_problem(exc))
        _Futures.fail(fut, f"{fut.call}: {_os_problem(exc)}", "server")
    except Exception as exc:  # a defect here: say so instead of hanging the client
        logger.error("local server: %s failed\n%s", fut.call, traceback.format_exc())
        _Futures.fail(fut, f"{fut.call}: internal error of the local engine: {type(exc).__name__}: {exc}", "server")
    else:
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], bytes):
            _Futures.resolve(fut, value[0], value[1])
        else:
            _Futures.resolve_json(fut, value)


# ---------------------------------------------------------------------------------------------
# training runs and samplers


class _Run:
    """One training run: its trainer and a worker that executes its requests in `seq_id` order."""

    def __init__(self, server: "LocalServer", model_id: str, session_id: str, base_model: str,
                 user_metadata: dict | None):
        self.server = server
        self.model_id, self.session_id, self.base_model = model_id, session_id, base_model
        self.user_metadata = dict(user_metadata or {})
        self.request: Any = None  # (call, body) of the request that made it, and its answer (`submit_first`)
        self.answer: dict | None = None
        self.created = time.time()
        self.last_request = self.created
        self.last_seen = time.monotonic()  # last_request on the clock that sleep and clock changes leave alone
        self.trainer: Any = None
        self._pending: dict[int, tuple[_Future, Callable]] = {}
        self._unordered: list[tuple[_Future, Callable]] = []
        self._next_seq = 1
        self._seen: dict[int, _Future] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._working = False
        #: Where its trainer lives: None for this process, else its training process's pid (workers.py).
        self.place: int | None = None
        self._thread = threading.Thread(target=self._work, name=f"local-run-{model_id}", daemon=True)
        self._thread.start()

    def submit_first(self, fut: _Future, fn: Callable) -> dict:
        """The job that creates the trainer runs before any numbered request.

        Returns:
            The answer to the request that made the run, kept as `answer` for that request sent
            again (`LocalServer._new_run`).
        """
        with self._cond:
            self._unordered.insert(0, (fut, fn))
            self._cond.notify_all()
        self.answer = {"request_id": fut.request_id, "model_id": self.model_id}
        return self.answer

    def trained(self) -> Any:
        """The run's trainer, for a request's work; EngineError when its creation failed."""
        if self.trainer is None:
            raise EngineError("the training run was not created")
        return self.trainer

    def submit(self, seq_id: int | None, call: str, fn: Callable) -> _Future:
        """Queue `fn` as request `seq_id` (a retried request returns the future it already has).

        A `seq_id` more than `SEQ_WINDOW` places ahead of the next one to run is a 400: queued, it
        would hold up every later request of the run."""
        with self._cond:
            self.last_request, self.last_seen = time.time(), time.monotonic()
            if seq_id is not None and seq_id in self._seen:
                return self._seen[seq_id]
            if seq_id is not None and seq_id >= self._next_seq + SEQ_WINDOW:
                raise ApiError(400, f"{call}: seq_id {seq_id} is too far ahead of this run's next request "
                                    f"({self._next_seq}; at most {SEQ_WINDOW - 1} ahead are queued). Send the "
                                    "run's requests in order, numbered from the SDK's own training client.",
                               "seq_id")
            fut = self.server.futures.new(call)
            if seq_id is None:
                self._unordered.append((fut, fn))
            elif seq_id < self._next_seq:
                _Futures.fail(fut, f"{call}: seq_id {seq_id} was already executed (next is {self._next_seq})")
            else:
                self._pending[seq_id] = (fut, fn)
                self._seen[seq_id] = fut
            self._cond.notify_all()
            return fut

    def skip(self, seq_id: Any, call: str) -> None:
        """Take request `seq_id`'s place in the run's order for a request that was refused (a 4xx),
        so the requests after it run at once instead of waiting for it. Does nothing for a number
        that is not a whole number, is already taken, or lies outside the window `submit` accepts."""
        if isinstance(seq_id, bool) or not isinstance(seq_id, int):
            return
        with self._cond:
            if seq_id in self._seen or seq_id < self._next_seq or seq_id >= self._next_seq + SEQ_WINDOW:
                return
        try:
            self.submit(seq_id, call, _refused)
        except ApiError:  # taken meanwhile
            pass

    def _take(self) -> tuple[_Future, Callable] | None:
        with self._cond:
            waited_since: float | None = None
            while not self._closed:
                if self._unordered:
                    return self._unordered.pop(0)
                job = self._pending.pop(self._next_seq, None)
                if job is not None:
                    self._next_seq += 1
                    if len(self._seen) > 4096:  # keep retry dedup bounded
                        for k in sorted(self._seen)[:2048]:
                            del self._seen[k]
                    return job
                if self._pending:
                    waited_since = waited_since or time.monotonic()
                    if time.monotonic() - waited_since > SEQ_GAP_TIMEOUT_S:
                        missing, last = self._next_seq, max(self._pending)
                        for seq in sorted(self._pending):
                            fut, _ = self._pending.pop(seq)
                            _Futures.fail(fut, f"{fut.call}: request seq_id {missing} of this run never arrived "
                                               f"(waited {SEQ_GAP_TIMEOUT_S:g} s)")
                        self._next_seq = last + 1  # every number up to the last failed one is taken
                        waited_since = None
                        continue
                    self._cond.wait(1.0)
                else:
                    waited_since = None
                    self._cond.wait()
            return None

    def _work(self) -> None:
        from .compute import configure_torch

        try:
            configure_torch(self.server.threads)
            problem: Exception | None = None
        except Exception as exc:  # a bad $MACHINE_NB_THREADS: each request says so
            problem = exc
        while True:
            job = self._take()
            if job is None:
                break
            fut, fn = job
            if problem is not None:
                _Futures.fail(fut, f"{fut.call}: {problem}", "user")
                continue
            self._working = True
            try:
                _run_job(fut, fn)
            finally:
                self._working = False
        release = getattr(self.trainer, "close", None)  # a trainer in a training process (workers.py)
        if release is not None:
            release()

    def active(self, now: float) -> bool:
        """Whether the run is training now: a request running or queued, or one within ACTIVE_S (a
        run whose trainer could not be made never trains)."""
        return (self._working or bool(self._pending or self._unordered)
                or (self.trainer is not None and now - self.last_request < ACTIVE_S))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _refused() -> dict:
    raise EngineError("the request was refused")


class _Worker:
    """One daemon thread running the jobs given to it in order. Not a ThreadPoolExecutor: those
    refuse new work once the interpreter begins to exit, while a thread of the user's may still be
    sampling (Python joins it only afterwards)."""

    def __init__(self, name: str, threads: int | None):
        import queue

        self._jobs: "queue.SimpleQueue[tuple[Callable, tuple] | None]" = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()  # no job is queued behind shutdown's end marker
        self.submit(_configure, threads)
        self.thread = threading.Thread(target=self._work, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn: Callable, *args: Any) -> None:
        """Queue `fn(*args)`; after `shutdown` it is dropped at once (`_drop`)."""
        with self._lock:
            if not self._closed:
                self._jobs.put((fn, args))
                return
        _drop(fn, args)

    def _work(self) -> None:
        problem: Exception | None = None
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args = job
            if self._closed:
                _drop(fn, args)
            elif problem is not None and fn is _run_job:
                _Futures.fail(args[0], f"{args[0].call}: {problem}", "user")
            else:
                try:
                    fn(*args)
                except Exception as exc:  # `_configure`'s (a request's job reports its own errors)
                    problem = exc

    def shutdown(self) -> None:
        """End the thread after the job in progress; jobs still queued are dropped, and the futures
        of the requests among them fail saying so (a client polling one would otherwise wait forever)."""
        with self._lock:
            self._closed = True
            self._jobs.put(None)


def _drop(fn: Callable, args: tuple) -> None:
    """A job of a worker that was shut down: a request's (`_run_job`) fails its future."""
    if fn is _run_job:
        fut = args[0]
        _Futures.fail(fut, f"{fut.call}: the sampler was let go before this request ran (its session ended, it "
                           f"was unused for {SAMPLER_IDLE_S:g} s, or more than {MAX_SAMPLERS} samplers were open, "
                           "or the server stopped); create the sampling client again", "server")


class _Sampler:
    """A sampling session: fixed weights and one worker that runs its requests in arrival order."""

    def __init__(self, server: "LocalServer", sampler_id: str, sampler: Any, model_path: str | None,
                 session_id: str | None = None):
        self.server, self.sampler_id, self.sampler, self.model_path = server, sampler_id, sampler, model_path
        self.session_id = session_id
        self.last_used = time.monotonic()
        self.base_model = sampler.base_model
        self.worker_name = f"local-sampler-{sampler_id[-6:]}"
        self.worker = _Worker(self.worker_name, server.threads)

    def submit(self, call: str, fn: Callable) -> _Future:
        self.last_used = time.monotonic()
        fut = self.server.futures.new(call)
        if getattr(self.sampler, "concurrent", False):  # it batches requests that run at once
            threading.Thread(target=_run_job, args=(fut, fn), name=f"{self.worker_name}-req", daemon=True).start()
        else:
            self.worker.submit(_run_job, fut, fn)
        return fut


def _configure(threads: int | None) -> None:
    from .compute import configure_torch

    configure_torch(threads)


@dataclass
class _Session:
    session_id: str
    user_metadata: dict
    created: float
    #: time.monotonic() of its last heartbeat, so a wall clock set forward (or a laptop's sleep) lets
    #: no live session go
    last_heartbeat: float
    finished: bool = False


# ---------------------------------------------------------------------------------------------
# request parsing helpers


def _validation_message(exc: Exception) -> tuple[str, str | None]:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            loc = ".".join(str(p) for p in first.get("loc", ()))
            return f"{first.get('msg', exc)}", loc or None
        except Exception:  # fall back to the text
            pass
    return str(exc), None


def _parse(model_cls: Any, body: Any, call: str) -> Any:
    """`body` validated as an SDK request type; a 400 naming the field otherwise."""
    try:
        return model_cls.model_validate(body)
    except Exception as exc:  # pydantic.ValidationError
        message, where = _validation_message(exc)
        raise ApiError(400, f"{call}: {message}" + (f" (field {where})" if where else ""), where) from None


def _dump(value: Any) -> Any:
    return value.model_dump(mode="json", exclude_none=True)


def _check_seed(seed: int | None, call: str, where: str) -> None:
    """A 400 naming `where` for a seed outside SEED_RANGE (None: the server picks one)."""
    if seed is not None and seed not in SEED_RANGE:
        raise ApiError(400, f"{call}: a seed is a whole number from -2**63 to 2**63 - 1, got {seed}", where)


def _token_ids(model_input: Any, where: str) -> list[int]:
    try:
        return [int(t) for t in model_input.to_ints()]
    except ValueError as exc:
        raise ApiError(400, f"{exc}: the local engine takes text token chunks only", where) from None


def _damaged(call: str, exc: MachineFormatError, field_name: str | None) -> ApiError:
    """The 400 for a file of the data dir that cannot be used: it names the file and its field, and
    carries them (`file`, `reason`) for the client to raise MachineFormatError (`engines.explain`)."""
    return ApiError(400, f"{call}: {exc}", field_name, error_type="MachineFormatError", file=exc.path,
                    reason=ck.describe(exc))


# ---------------------------------------------------------------------------------------------
# the server


class LocalServer:
    """The Tinker-compatible server: `start()` in a background thread, or `serve_forever()`.

    host / port: where to listen (default 127.0.0.1 and a free port). Any host but loopback
      needs a `key` given.
    key: the API key every request must send (`X-API-Key`; 401 otherwise); default None makes a
      random one (`.key`), which the process hands to its own clients.
    data_dir: where runs and checkpoints are written (default `checkpoints.default_data_dir()`).
    threads: torch threads for the work (default $MACHINE_NB_THREADS, else 1: reproducible).
    train_workers: training processes for runs of the engine's own models that start while
      others train (workers.py), so that different runs' steps run in parallel; default 0 keeps
      every run in this process. `machine-nb serve` uses one fewer than the cores.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, data_dir: str | os.PathLike | None = None,
                 key: str | None = None, threads: int | None = None, quiet: bool = True, train_workers: int = 0):
        if not _is_loopback(host) and not key:
            raise EngineError(f"binding {host!r} (not loopback) exposes the server to other machines: "
                              "give it a key that every request must send as its API key (--key-file, or "
                              "$MACHINE_NB_SERVER_KEY)")
        self.key = ck.check_key(key) if key is not None else ck.new_key()
        self.host, self.threads, self.quiet = host, threads, quiet
        self.data_dir = Path(data_dir).expanduser().absolute() if data_dir is not None else ck.default_data_dir()
        ck.ensure_private_dir(self.data_dir)
        self.futures = _Futures()
        self.sessions: dict[str, _Session] = {}
        self.runs: dict[str, _Run] = {}
        self.samplers: dict[str, _Sampler] = {}
        #: Why each sampler let go lately was (`_reap`), for the 404 of a request that names it.
        self._let_go: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.train_pool: Any = None
        self._placing = threading.Lock()  # one new run placed at a time
        if train_workers > 0:
            from .workers import TrainerPool

            self.train_pool = TrainerPool(train_workers, threads)
        self._socket = _listen(host, port)
        self.port = self._socket.getsockname()[1]
        self._app = _App(self)
        self._uvicorn: Any = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stopping = threading.Event()  # wakes long-polls when the server stops
        self._stopped = False
        self._on_stop: list[Callable[[], None]] = []
        self._in_flight = 0
        self._capabilities: dict | None = None
        self._routes = self._route_table()
        #: Whether SDK clients may run in this process: then each sampler's tokenizer is also loaded
        #: into the SDK's cache (`engines.local.sdk_tokenizer`); `serve()` clears it.
        self.sdk_in_process = True

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    # -- lifecycle
    def start(self) -> "LocalServer":
        """Serve in a daemon thread; returns once the socket accepts connections."""
        self._thread = threading.Thread(target=self._serve, name="machine-nb-tinker-server", daemon=True)
        self._thread.start()
        self._started.wait(30)
        with _RUNNING_LOCK:
            _RUNNING[self.url] = self
        return self

    def serve_forever(self) -> None:
        """Serve until `stop()` is called (from another thread, or a signal handler's)."""
        self.start()
        self._thread.join()

    def _serve(self) -> None:
        import asyncio

        import uvicorn

        config = uvicorn.Config(self._app, http="httptools", loop="asyncio", lifespan="off", log_config=None,
                                log_level="warning", access_log=False, proxy_headers=False,
                                server_header=False, date_header=False, timeout_keep_alive=120,
                                timeout_graceful_shutdown=LONG_POLL_S + 10)
        self._uvicorn = uvicorn.Server(config)

        async def main() -> None:
            self._app.listen_for_stop(asyncio.get_running_loop())
            task = asyncio.ensure_future(self._uvicorn.serve(sockets=[self._socket]))
            while not self._uvicorn.started and not task.done():
                await asyncio.sleep(0.005)
            self._started.set()
            await task

        try:
            asyncio.run(main())
        finally:
            self._started.set()

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call `callback()` when `stop()` begins, while this server still answers: a client of it
        finishes its SDK sessions there (`engines.service_client` does so for the clients it keeps),
        so no heartbeat of theirs is left failing against a server that is gone."""
        with self._lock:
            self._on_stop.append(callback)

    def stop(self, *, notify: bool = True) -> None:
        """Call the `on_stop` callbacks (unless `notify` is False), stop accepting requests, answer
        the ones in progress (a long-poll whose result is not ready gets a failed future saying the
        server stopped), close the connections, and end the workers (finished checkpoints stay on
        disk), and stop the SDK session heartbeats this process sends here, whoever made their
        clients (tinker-cookbook makes its own), so none is left failing against a server that is
        gone. A second call does nothing."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            callbacks, self._on_stop = (self._on_stop if notify else []), []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a client that cannot finish must not keep the server up
                logger.debug("local server: a stop callback failed", exc_info=True)
        with _RUNNING_LOCK:
            if _RUNNING.get(self.url) is self:
                del _RUNNING[self.url]
        from .workarounds import stop_heartbeats_to

        stop_heartbeats_to(self.url)
        self._stopping.set()
        self._app.stop()
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(LONG_POLL_S + 15)
        self._socket.close()
        self._app.threads.close()
        with self._lock:
            runs, samplers = list(self.runs.values()), list(self.samplers.values())
        for run in runs:
            run.close()
        for s in samplers:
            s.worker.shutdown()
        # the step or sample in progress finishes: torch work cut off by the process's exit can abort it
        for thread in [r._thread for r in runs] + [s.worker.thread for s in samplers]:
            thread.join(60)
        if self.train_pool is not None:
            self.train_pool.close()

    # -- dispatch
    def _route_table(self) -> dict[tuple[str, str], Callable]:
        r = {
            ("GET", "/api/v1/healthz"): lambda q, b: {"status": "ok"},
            ("POST", "/api/v1/client/config"): self.client_config,
            ("POST", "/api/v1/client/dynamic_config"): lambda q, b: {},
            ("GET", "/api/v1/get_server_capabilities"): self.capabilities,
            ("POST", "/api/v1/create_session"): self.create_session,
            ("POST", "/api/v1/session_heartbeat"): self.heartbeat,
            ("POST", "/api/v1/telemetry"): lambda q, b: {"status": "accepted"},
            ("POST", "/api/v1/create_model"): self.create_model,
            ("POST", "/api/v1/get_info"): self.get_info,
            ("POST", "/api/v1/forward_backward"): self.forward_backward,
            ("POST", "/api/v1/forward"): self.forward_backward,
            ("POST", "/api/v1/optim_step"): self.optim_step,
            ("POST", "/api/v1/save_weights"): self.save_weights,
            ("POST", "/api/v1/save_weights_for_sampler"): self.save_weights_for_sampler,
            ("POST", "/api/v1/load_weights"): self.load_weights,
            ("POST", "/api/v1/create_sampling_session"): self.create_sampling_session,
            ("POST", "/api/v1/asample"): self.asample,
            ("POST", "/api/v1/retrieve_future"): self.retrieve_future,
            ("POST", "/api/v1/cancel_future"): lambda q, b: {},
            ("POST", "/api/v1/weights_info"): self.weights_info,
            ("GET", "/api/v1/training_runs"): self.list_training_runs,
            ("GET", "/api/v1/checkpoints"): self.list_all_checkpoints,
        }
        return r

    def dispatch(self, method: str, path: str, query: dict, body: Any, raw: bytes, headers: Any) -> tuple[int, bytes, str]:
        if path in _HOUSEKEEPING:
            return self._dispatch(method, path, query, body, raw, headers)
        with self._lock:
            self._in_flight += 1
        try:
            return self._dispatch(method, path, query, body, raw, headers)
        finally:
            with self._lock:
                self._in_flight -= 1

    @property
    def stopped(self) -> bool:
        """Whether `stop()` was called (the server answers nothing from then on)."""
        with self._lock:
            return self._stopped

    def busy(self) -> bool:
        """Whether a request is in progress here (heartbeats, telemetry and health checks aside)."""
        with self._lock:
            return self._in_flight > 0

    def check_key(self, path: str, sent: str | None, *, authorization: bool = False) -> None:
        """401 unless `sent` (the X-API-Key header) is this server's key. Only the health check
        answers without it (it says "ok" and nothing else). `authorization`: whether the request has
        an Authorization header instead, which the answer then says is not read."""
        if path == "/api/v1/healthz":
            return
        if not hmac.compare_digest((sent or "").encode("utf-8", "replace"), self.key.encode("utf-8")):
            hint = " (an Authorization header is not read here)" if authorization and not sent else ""
            raise ApiError(401, "this server needs its key: send it as the API key (TINKER_API_KEY), which is the "
                                f"X-API-Key header{hint}; `machine-nb serve` says where it is")

    def _dispatch(self, method: str, path: str, query: dict, body: Any, raw: bytes, headers: Any) -> tuple[int, bytes, str]:
        self.check_key(path, headers.get("X-API-Key"))
        handler = self._routes.get((method, path))
        if handler is None:
            handler = self._dynamic_route(method, path)
        if handler is None:
            allowed = sorted({m for m, p in self._routes if p == path}
                             | {m for m in ("GET", "POST", "DELETE") if m != method and self._dynamic_route(m, path)})
            if allowed:
                raise ApiError(405, f"{method} {path}: this call takes {' or '.join(allowed)}", allow=allowed)
            raise ApiError(404, f"the local Tinker server does not support {method} {path}")
        try:
            if path in _PROTOBUF_CALLS:
                result = handler(query, raw, headers)
            else:
                result = handler(query, body)
        except ApiError:
            if path in _ORDERED_CALLS and isinstance(body, dict):
                # a refused request of a training run still takes its place in the run's order
                run = self.runs.get(body.get("model_id")) if isinstance(body.get("model_id"), str) else None
                if run is not None:
                    run.skip(body.get("seq_id"), path.rsplit("/", 1)[-1])
            raise
        if isinstance(result, tuple):
            return result
        return 200, json.dumps(result).encode("utf-8"), "application/json"

    def _dynamic_route(self, method: str, path: str) -> Callable | None:
        parts = path.strip("/").split("/")
        if parts[:2] != ["api", "v1"]:
            return None
        rest = parts[2:]
        if method == "GET" and len(rest) == 2 and rest[0] == "samplers":
            return lambda q, b: self.get_sampler(rest[1])
        if method == "POST" and len(rest) == 3 and rest[0] == "sessions" and rest[2] == "finish":
            return lambda q, b: self.finish_session(rest[1])
        if method == "GET" and len(rest) == 2 and rest[0] == "sessions":
            return lambda q, b: self.get_session(rest[1])
        if method == "GET" and len(rest) == 2 and rest[0] == "training_runs":
            return lambda q, b: self.get_training_run(rest[1])
        if method == "GET" and len(rest) == 3 and rest[0] == "training_runs" and rest[2] == "checkpoints":
            return lambda q, b: self.list_checkpoints(rest[1])
        if method == "DELETE" and len(rest) >= 5 and rest[0] == "training_runs" and rest[2] == "checkpoints":
            return lambda q, b: self.delete_checkpoint(rest[1], "/".join(rest[3:]))
        return None

    # -- start-up and sessions
    def client_config(self, q: dict, body: Any) -> dict:
        # SDK defaults, except: API keys only (no JWT exchange), uncompressed forward/backward, and
        # httpx's own transport rather than pyqwest's. pyqwest hands each response to asyncio from a
        # thread of its own; one that does so while the interpreter ends (a script that returns with
        # a request or heartbeat in flight) is ended by Python 3.11's pthread_exit through Rust frames,
        # and the process aborts (SIGABRT, no message) after its work was done.
        return {"pjwt_auth_enabled": False, "proto_compress_fwdbwd": False, "use_pyqwest_transport": False}

    def capabilities(self, q: dict, body: Any) -> dict:
        """The models served (read once: they are fixed for the life of the process)."""
        if self._capabilities is None:
            self._capabilities = self._read_capabilities()
        return self._capabilities

    def _read_capabilities(self) -> dict:
        from . import MODELS, load_config

        models = []
        for name in sorted(MODELS):
            models.append({"model_name": name, "max_context_length": load_config(name).block_size,
                           "trainable": True, "sampleable": True})
        return {"supported_models": models}

    def create_session(self, q: dict, body: Any) -> dict:
        from tinker import types

        req = _parse(types.CreateSessionRequest, body, "create_session")
        self._reap()
        sid = f"{ck.RUN_PREFIX}{secrets.token_hex(8)}"
        now = time.time()
        with self._lock:
            self.sessions[sid] = _Session(sid, dict(req.user_metadata or {}), now, time.monotonic())
        return {"type": "create_session", "session_id": sid}

    def heartbeat(self, q: dict, body: Any) -> dict:
        sid = (body or {}).get("session_id") if isinstance(body, dict) else None
        if not isinstance(sid, str):
            raise ApiError(400, f"session_heartbeat: session_id must be a string, got {type(sid).__name__}",
                           "session_id")
        session = self.sessions.get(sid)
        if session is None:
            raise ApiError(404, f"session_heartbeat: no session {sid!r} on this server", "session_id")
        if session.finished:
            raise ApiError(410, f"session {sid} has finished")
        session.last_heartbeat = time.monotonic()
        return {"type": "session_heartbeat"}

    def finish_session(self, sid: str) -> dict:
        session = self.sessions.get(sid)
        if session is not None:
            session.finished = True
        return {}

    def get_session(self, sid: str) -> dict:
        session = self.sessions.get(sid)
        if session is None:
            raise ApiError(404, f"no session {sid!r} on this server")
        with self._lock:
            runs = [m for m, r in self.runs.items() if r.session_id == sid]
            samplers = [k for k, s in self.samplers.items() if s.session_id == sid]
        return {"training_run_ids": runs, "sampler_ids": samplers}

    def _reap(self) -> None:
        """Let go of the runs and samplers of sessions that stopped sending heartbeats (their
        checkpoints stay on disk; a client that comes back after that gets a 404 naming the run)."""
        cutoff = time.monotonic() - SESSION_TTL_S
        with self._lock:
            gone = {sid for sid, s in self.sessions.items() if s.finished or s.last_heartbeat < cutoff}
            runs = [self.runs.pop(m) for m, r in list(self.runs.items())
                    if r.session_id in gone and r.last_seen < cutoff]
            idle = time.monotonic() - SAMPLER_IDLE_S
            samplers = [self.samplers.pop(k) for k, v in list(self.samplers.items())
                        if v.session_id in gone or v.last_used < idle]
            for sampler in samplers:
                self._forget(sampler.sampler_id,
                             f"its session finished, or sent no heartbeat for {SESSION_TTL_S:g} s"
                             if sampler.session_id in gone else f"it was unused for {SAMPLER_IDLE_S:g} s")
            by_use = sorted(self.samplers.items(), key=lambda kv: kv[1].last_used)
            for k, _ in by_use[:max(0, len(by_use) - MAX_SAMPLERS)]:
                samplers.append(self.samplers.pop(k))
                self._forget(k, f"more than {MAX_SAMPLERS} samplers were open: the least recently used go first")
            for sid in gone:
                if not any(r.session_id == sid for r in self.runs.values()):
                    self.sessions.pop(sid, None)
        for run in runs:
            run.close()
        for sampler in samplers:
            sampler.worker.shutdown()

    def _forget(self, sampler_id: str, why: str) -> None:
        """Note why a sampler was let go (the last 4096 are kept); the caller holds `_lock`."""
        self._let_go[sampler_id] = why
        while len(self._let_go) > 4096:
            self._let_go.popitem(last=False)

    def _no_sampler(self, sampler_id: str, call: str) -> ApiError:
        """The 404 for a sampler this server does not hold: why it was let go, when it was."""
        why = self._let_go.get(sampler_id)
        if why is not None:
            return ApiError(404, f"{call}: sampler {sampler_id!r} was let go ({why}); create the sampling client "
                                 "again", "sampling_session_id")
        return ApiError(404, f"{call}: no sampler {sampler_id!r} on this server (was it restarted?)",
                        "sampling_session_id")

    def _session(self, sid: str, call: str) -> _Session:
        session = self.sessions.get(sid)
        if session is None:
            raise ApiError(404, f"{call}: no session {sid!r} on this server (was it restarted?)", "session_id")
        return session

    # -- training runs
    def _run(self, model_id: str, call: str) -> _Run:
        run = self.runs.get(model_id)
        if run is None:
            raise ApiError(404, f"{call}: no training run {model_id!r} on this server (was it restarted?)", "model_id")
        return run

    def _check_base_model(self, name: str, call: str) -> None:
        from . import MODELS

        if name not in MODELS:
            raise ApiError(400, f"{call}: the local engine does not serve {name!r}; it serves "
                                f"{', '.join(sorted(MODELS))} (Tinker models need Tinker itself)", "base_model")

    def _new_run(self, session_id: str, model_seq_id: int, base_model: str, user_metadata: dict | None,
                 call: str, request: Any) -> tuple[_Run, dict | None]:
        """The new run `<session_id>:train:<model_seq_id>`, and None; or, for `request` (the body)
        sent again once it was answered (its answer was lost, and the SDK retries), the run it made
        and that answer. Another request for a run that exists is a 409."""
        if not 0 <= model_seq_id <= ck.MAX_MODEL_SEQ_ID:  # a run id holds it as digits: its folder's name
            raise ApiError(400, f"{call}: model_seq_id must be a whole number from 0 to 2**63 - 1, got "
                                f"{model_seq_id if model_seq_id < 10**30 else 'a larger one'}", "model_seq_id")
        model_id = f"{session_id}:train:{model_seq_id}"
        with self._lock:
            held = self.runs.get(model_id)
            if held is not None:
                if held.answer is not None and held.request == (call, request):
                    return held, held.answer
                raise ApiError(409, f"training run {model_id} exists already", "model_seq_id")
            run = _Run(self, model_id, session_id, base_model, user_metadata)
            run.request = (call, request)
            self.runs[model_id] = run
        return run, None

    def _pool_for(self, base_model: str) -> Any:
        """The training processes a new run of `base_model` may go to, or None to train it here:
        the real model's runs stay here, sharing one frozen base (workers.py)."""
        from . import MODELS

        entry = MODELS.get(base_model)
        return self.train_pool if entry is not None and entry.backend is None else None

    def _new_trainer(self, run: _Run, how: str, what: str, settings: dict) -> Any:
        """`run`'s trainer, `workers.new_trainer(how, what, settings)`, made where `_place` puts it."""
        from .workers import RemoteTrainer, new_trainer

        process = self._place(run)
        return new_trainer(how, what, settings) if process is None else RemoteTrainer(process, how, what, settings)

    def _place(self, run: _Run) -> Any:
        """The training process `run` trains in, or None for this process (TrainerPool.place):
        a run alone trains here; a run that starts while others are training goes where none is.
        A run whose session its client has finished trains no more (a script's runs one after
        another: the next one starts within ACTIVE_S of the last one's final save)."""
        pool = self._pool_for(run.base_model)
        if pool is None:
            return None
        with self._placing:
            now = time.time()
            with self._lock:
                done = {sid for sid, s in self.sessions.items() if s.finished}
                others = [r for r in self.runs.values()
                          if r is not run and not r._closed and r.session_id not in done and r.active(now)]
            busy: dict[int | None, int] = {}
            for r in others:
                busy[r.place] = busy.get(r.place, 0) + 1
            process = pool.place(busy)
            run.place = None if process is None else process.proc.pid
            return process

    def _start_run(self, run: _Run, how: str, what: str, settings: dict) -> None:
        """Give `run` its trainer (`_new_trainer`) and write its run.json. When the record cannot be
        written (a full disk) the trainer is let go again: the client is told the run was not
        created, and the run's later requests fail saying so instead of training unrecorded."""
        run.trainer = self._new_trainer(run, how, what, settings)
        try:
            self._write_run_record(run)
        except BaseException:
            trainer, run.trainer = run.trainer, None
            release = getattr(trainer, "close", None)  # a trainer in a training process (workers.py)
            if release is not None:
                release()
            raise

    def _writable(self, path: Path) -> Path:
        """`path`, when it lies under the data dir (links resolved): the server writes nowhere else."""
        if not ck.is_inside(path, self.data_dir):
            raise EngineError(f"{path} is outside this server's data dir {self.data_dir} (a link?); not written")
        return path

    def _write_run_record(self, run: _Run) -> None:
        t = run.trainer
        record = {"training_run_id": run.model_id, "base_model": run.base_model, "lora_rank": t.rank,
                  "lora_alpha": t.alpha, "targets": t.targets, "seed": t.seed, "user_metadata": run.user_metadata,
                  "created": run.created}
        from ...core.jsonl import atomic_write_text

        directory = ck.ensure_private_dir(self._writable(ck.run_dir(self.data_dir, run.model_id)))
        atomic_write_text(directory / "run.json", json.dumps(record, indent=1))

    def create_model(self, q: dict, body: Any) -> dict:
        from tinker import types

        req = _parse(types.CreateModelRequest, body, "create_model")
        self._session(req.session_id, "create_model")
        self._check_base_model(req.base_model, "create_model")
        if req.optimizer_config is not None and getattr(req.optimizer_config, "type", "adamw") != "adamw":
            raise ApiError(400, f"create_model: the local engine trains with AdamW only, not "
                                f"{req.optimizer_config.type!r}", "optimizer_config.type")
        lora = req.lora_config
        rank = 32 if lora is None else int(lora.rank)
        if rank < 0:  # rank 0 is full fine-tuning, a local-engine extension (Tinker has none)
            raise ApiError(400, f"create_model: LoRA rank must be 0 (full fine-tuning) or more, got {rank}",
                           "lora_config.rank")
        _check_seed(None if lora is None else lora.seed, "create_model", "lora_config.seed")
        from . import max_lora_rank, model_entry

        if rank == 0 and model_entry(req.base_model).kind == "hf":  # full fine-tuning: the tiny model's only
            raise ApiError(400, f"create_model: {req.base_model} trains LoRA adapters only: give a LoRA rank of 1 or "
                                "more (rank 0, full fine-tuning, is the tiny model's)", "lora_config.rank")

        if rank > (most := max_lora_rank(req.base_model)):
            raise ApiError(400, f"create_model: LoRA rank {rank} is past {req.base_model}'s width: give at most "
                                f"{most} (a higher rank adds no capacity, only memory)", "lora_config.rank")
        run, again = self._new_run(req.session_id, req.model_seq_id, req.base_model, req.user_metadata,
                                   "create_model", body)
        if again is not None:
            return again
        fut = self.futures.new("create_model")

        settings = {"rank": rank, "seed": None if lora is None else lora.seed,
                    "train_attn": True if lora is None else lora.train_attn,
                    "train_mlp": True if lora is None else lora.train_mlp,
                    "train_unembed": True if lora is None else lora.train_unembed}

        def create() -> dict:
            self._start_run(run, "create", req.base_model, settings)
            return {"model_id": run.model_id, "type": "create_model"}

        return run.submit_first(fut, create)

    def get_info(self, q: dict, body: Any) -> dict:
        from tinker import types

        from . import is_hf, tokenizer_dir

        req = _parse(types.GetInfoRequest, body, "get_info")
        run = self._run(req.model_id, "get_info")
        rank = run.trainer.rank if run.trainer is not None else None
        return {"type": "get_info", "model_id": run.model_id, "is_lora": bool(rank), "lora_rank": rank or None,
                "model_name": run.base_model,
                "model_data": {"arch": "llama" if is_hf(run.base_model) else "gpt", "model_name": run.base_model,
                               "tokenizer_id": str(tokenizer_dir(run.base_model))}}

    def forward_backward(self, q: dict, raw: bytes, headers: Any) -> dict:
        from . import wire

        if "protobuf" not in (headers.get("Content-Type") or ""):
            raise ApiError(400, "forward_backward: the body must be a ForwardBackwardRequest protobuf "
                                f"(Content-Type {wire.CONTENT_TYPE}), as the tinker SDK sends it")
        if headers.get("Content-Encoding"):
            raise ApiError(400, f"forward_backward: Content-Encoding {headers.get('Content-Encoding')!r} is not "
                                "accepted (this server asks clients for uncompressed bodies)")
        try:
            req = wire.decode_forward_backward(raw)
        except wire.WireError as exc:
            run = self.runs.get(exc.model_id) if exc.model_id is not None else None
            if run is not None:  # a refused request still takes its place in the run's order
                run.skip(exc.seq_id, "forward_backward")
            raise ApiError(400, f"forward_backward: {exc}", exc.field) from None
        call = "forward" if req.forward_only else "forward_backward"
        run = self._run(req.model_id, call)
        try:
            batch, loss = self._loss_batch(run, req, call)
        except ApiError:
            run.skip(req.seq_id, call)  # a refused request still takes its place in the run's order
            raise

        def work() -> tuple[bytes, str]:
            logprobs, elementwise, total = run.trained().guarded_forward_backward(batch, backward=not req.forward_only,
                                                                                loss=loss)
            outputs = [{"logprobs": lp, "elementwise_loss": el} for lp, el in zip(logprobs, elementwise)]
            return wire.encode_forward_backward_output(outputs, {"loss:sum": total}), wire.CONTENT_TYPE

        fut = run.submit(req.seq_id, call, work)
        return {"request_id": fut.request_id, "model_id": run.model_id}

    def _loss_batch(self, run: _Run, req: Any, call: str) -> tuple[list, Any]:
        """A forward/backward request's data as the trainer takes it, and its loss (losses.py); a 400
        naming the field for anything that cannot be used as it is."""
        import numpy as np

        from . import load_config
        from . import losses as ls
        from .compute import Example

        if not req.data:
            raise ApiError(400, f"{call}: no data", "data")
        cfg = load_config(run.base_model)
        targets = []
        for i, d in enumerate(req.data):
            if "target_tokens" not in d.loss_fn_inputs:
                raise ApiError(400, f"{call}: {req.loss_fn} needs loss_fn_inputs 'target_tokens'",
                               f"data.{i}.loss_fn_inputs.target_tokens")
            tgt = d.loss_fn_inputs["target_tokens"]
            where = f"data.{i}.loss_fn_inputs.target_tokens"
            if tgt.dtype.kind == "f":
                if not np.all(np.isfinite(tgt)) or not np.all(tgt == np.round(tgt)):
                    raise ApiError(400, f"{call}: target_tokens must be whole token ids, got a value such as "
                                        f"{tgt[~(np.isfinite(tgt) & (tgt == np.round(tgt)))][0]}", where)
            if len(d.ids) != len(tgt):
                raise ApiError(400, f"{call}: model_input has {len(d.ids)} tokens, target_tokens {len(tgt)}; "
                                    "they must be equal", f"data.{i}")
            if not d.ids:
                raise ApiError(400, f"{call}: empty model_input", f"data.{i}.model_input")
            if len(d.ids) > cfg.block_size:
                raise ApiError(400, f"{call}: {len(d.ids)} tokens exceed the context of {run.base_model} "
                                    f"({cfg.block_size} tokens)", f"data.{i}.model_input")
            tgt = tgt.astype("int64")
            bad = [t for t in list(d.ids) + tgt.tolist() if not 0 <= t < cfg.vocab_size]
            if bad:
                raise ApiError(400, f"{call}: token id {bad[0]} is outside the vocabulary of {run.base_model} "
                                    f"(0..{cfg.vocab_size - 1})", f"data.{i}")
            targets.append(tgt)
        try:
            prepared = ls.prepare(req.loss_fn, req.loss_fn_config, [d.loss_fn_inputs for d in req.data],
                                  [len(d.ids) for d in req.data])
        except ls.LossError as exc:
            raise ApiError(400, f"{call}: {exc}", exc.field) from None
        batch = []
        for i, d in enumerate(req.data):
            w = prepared.weights[i] if prepared.weights is not None else np.zeros(len(d.ids), np.float32)
            batch.append(Example(d.ids, targets[i], w))
        from . import check_batch

        try:
            check_batch(run.base_model, [len(ex.ids) for ex in batch], backward=not req.forward_only)
        except EngineError as exc:
            raise ApiError(400, f"{call}: {exc}", "data") from None
        return batch, prepared.fn

    def optim_step(self, q: dict, body: Any) -> dict:
        from tinker import types

        req = _parse(types.OptimStepRequest, body, "optim_step")
        run = self._run(req.model_id, "optim_step")
        p = req.optim_params
        if not isinstance(p, types.AdamParams):
            raise ApiError(400, f"optim_step: the local engine takes adam_params, not {getattr(p, 'type', p)!r}",
                           "adam_params")
        if not (p.grad_clip_norm == p.grad_clip_norm and abs(p.grad_clip_norm) != float("inf")) or p.grad_clip_norm < 0:
            raise ApiError(400, f"optim_step: grad_clip_norm must be a finite number >= 0, got {p.grad_clip_norm}",
                           "adam_params.grad_clip_norm")
        from .adamw import settings_problem

        problem = settings_problem(lr=p.learning_rate, beta1=p.beta1, beta2=p.beta2, eps=p.eps,
                                   weight_decay=p.weight_decay)
        if problem is not None:  # before the step is queued: the run is as it was
            raise ApiError(400, f"optim_step: {problem[0]} {problem[1]}", f"adam_params.{problem[0]}")

        def work() -> dict:
            metrics = run.trained().guarded_optim_step(learning_rate=p.learning_rate, beta1=p.beta1, beta2=p.beta2,
                                                     eps=p.eps, weight_decay=p.weight_decay,
                                                     grad_clip_norm=p.grad_clip_norm)
            return {"metrics": metrics}

        fut = run.submit(req.seq_id, "optim_step", work)
        return {"request_id": fut.request_id, "model_id": run.model_id}

    def _save(self, run: _Run, kind: str, name: str, user_metadata: dict | None, overwrite: bool = True) -> str:
        sub = "weights" if kind == "state" else "sampler_weights"
        final = self._writable(ck.run_dir(self.data_dir, run.model_id) / sub / ck.check_name(name))
        if final.exists() and not overwrite:
            raise EngineError(f"checkpoint {name!r} exists already (pass overwrite=True to replace it)")
        trainer = run.trained()
        meta = trainer.meta(kind, name, run.model_id, {**run.user_metadata, **(user_metadata or {})})
        trainer.save(final, meta, optimizer=kind == "state")
        return ck.tinker_path(run.model_id, sub, name)

    def save_weights(self, q: dict, body: Any) -> dict:
        from tinker import types

        req = _parse(types.SaveWeightsRequest, body, "save_weights")
        run = self._run(req.model_id, "save_weights")
        name = req.path or f"state-{secrets.token_hex(4)}"
        try:
            ck.check_name(name)
        except EngineError as exc:
            raise ApiError(400, f"save_weights: {exc}", "path") from None
        fut = run.submit(req.seq_id, "save_weights", lambda: {
            "path": self._save(run, "state", name, req.user_metadata, overwrite=True), "type": "save_weights"})
        return {"request_id": fut.request_id, "model_id": run.model_id}

    def save_weights_for_sampler(self, q: dict, body: Any) -> dict:
        from tinker import types

        req = _parse(types.SaveWeightsForSamplerRequest, body, "save_weights_for_sampler")
        run = self._run(req.model_id, "save_weights_for_sampler")
        if req.path is not None:
            try:
                ck.check_name(req.path)
            except EngineError as exc:
                raise ApiError(400, f"save_weights_for_sampler: {exc}", "path") from None

            def work() -> dict:
                return {"path": self._save(run, "sampler", req.path, req.user_metadata), "type": "save_weights_for_sampler"}
        else:
            def work() -> dict:
                trainer = run.trained()
                sampler = trainer.snapshot(seed=trainer.seed)
                sid = self._add_sampler(sampler, None, run.session_id)
                return {"sampling_session_id": sid, "type": "save_weights_for_sampler"}

        fut = run.submit(req.seq_id, "save_weights_for_sampler", work)
        return {"request_id": fut.request_id, "model_id": run.model_id}

    def _checkpoint_dir(self, path: str, call: str, field_name: str = "path", *, delete: bool = False) -> Path:
        """The folder of the checkpoint a request names in `field_name`, or the 4xx that says why not."""
        try:
            run_id, kind, name = ck.parse(path)
            directory = ck.run_dir(self.data_dir, run_id) / kind / name
        except EngineError as exc:
            raise ApiError(400, f"{call}: {exc}", field_name) from None
        # what a delete removes: the folder, or only the link when the folder is one
        if delete and not ck.is_inside(directory.parent if directory.is_symlink() else directory, self.data_dir):
            raise ApiError(403, f"{call}: {path} is a folder outside this server's data dir ({directory}); the "
                                "server deletes only checkpoints it wrote there. Delete the folder yourself if you "
                                "mean to.", field_name)
        if not (directory / "checkpoint.json").is_file():
            hint = (
                " A checkpoint made by another server (e.g. a separate `machine-nb serve`) is served by that server: "
                "send the request there (with machine_nb: engine='tinker' and TINKER_BASE_URL set to its URL).")
            raise ApiError(404, f"{call}: no checkpoint {path} on this server (looked in {directory}).{hint}",
                           field_name)
        return directory

    def load_weights(self, q: dict, body: Any) -> dict:
        from tinker import types

        from .checkpoints import read_meta

        req = _parse(types.LoadWeightsRequest, body, "load_weights")
        directory = self._checkpoint_dir(req.path, "load_weights")
        if req.model_id is not None:  # load into an existing run, in its request order
            run = self._run(req.model_id, "load_weights")
            fut = run.submit(req.seq_id, "load_weights", lambda: (
                run.trained().load(directory, optimizer=req.optimizer),
                {"path": req.path, "type": "load_weights"})[1])
            return {"request_id": fut.request_id, "model_id": run.model_id}
        if req.session_id is None or req.model_seq_id is None:
            raise ApiError(400, "load_weights: give model_id, or session_id and model_seq_id for a new run", "model_id")
        self._session(req.session_id, "load_weights")
        try:
            meta = read_meta(directory)
        except MachineFormatError as exc:
            raise _damaged("load_weights", exc, "path") from None
        if req.base_model is not None and req.base_model != meta["base_model"]:
            raise ApiError(400, f"load_weights: {req.path} was trained from {meta['base_model']}, not {req.base_model}",
                           "base_model")
        run, again = self._new_run(req.session_id, req.model_seq_id, meta["base_model"],
                                   {**(meta.get("user_metadata") or {}), **(req.user_metadata or {})}, "load_weights",
                                   body)
        if again is not None:
            return again
        fut = self.futures.new("load_weights")

        def create() -> dict:
            self._start_run(run, "from_checkpoint", str(directory), {"optimizer": req.optimizer})
            return {"path": req.path, "type": "load_weights"}

        return run.submit_first(fut, create)

    # -- sampling
    def _add_sampler(self, sampler: Any, model_path: str | None, session_id: str | None = None) -> str:
        self._reap()
        self._tokenizer_by_name(sampler.base_model)
        sid = f"{ck.RUN_PREFIX}sampler-{secrets.token_hex(8)}"
        with self._lock:
            self.samplers[sid] = _Sampler(self, sid, sampler, model_path, session_id)
        return sid

    def _tokenizer_by_name(self, base_model: str) -> None:
        """Make the SDK's `SamplingClient.get_tokenizer()`, which loads a sampler's tokenizer by its
        base model's name, work offline: the tokenizer goes into the hub cache under that name, and
        into the SDK's own cache when this process may hold SDK clients (not `machine-nb serve`)."""
        from . import hub_tokenizer, sdk_tokenizer

        try:
            (sdk_tokenizer if self.sdk_in_process else hub_tokenizer)(base_model)
        except Exception as exc:  # sampling works without it; only get_tokenizer() by name would not
            logger.warning("local server: %s's tokenizer is not loadable by name (%s: %s)", base_model,
                           type(exc).__name__, exc)

    def create_sampling_session(self, q: dict, body: Any) -> dict:
        from tinker import types

        from .compute import Sampler, load_base

        req = _parse(types.CreateSamplingSessionRequest, body, "create_sampling_session")
        self._session(req.session_id, "create_sampling_session")
        if (req.model_path is None) == (req.base_model is None):
            raise ApiError(400, "create_sampling_session: give exactly one of model_path and base_model", "model_path")
        if req.model_path is not None:
            directory = self._checkpoint_dir(req.model_path, "create_sampling_session", "model_path")
            try:
                sampler = Sampler.from_checkpoint(directory)
            except MachineFormatError as exc:
                raise _damaged("create_sampling_session", exc, "model_path") from None
            except EngineError as exc:
                raise ApiError(400, f"create_sampling_session: {exc}", "model_path") from None
        else:
            self._check_base_model(req.base_model, "create_sampling_session")
            sampler = Sampler(load_base(req.base_model), req.base_model)
        return {"type": "create_sampling_session",
                "sampling_session_id": self._add_sampler(sampler, req.model_path, req.session_id)}

    def get_sampler(self, sid: str) -> dict:
        s = self.samplers.get(sid)
        if s is None:
            raise self._no_sampler(sid, "get_sampler")
        out = {"sampler_id": sid, "base_model": s.base_model}
        if s.model_path:
            out["model_path"] = s.model_path
        return out

    def asample(self, q: dict, body: Any) -> dict:
        from tinker import types

        from . import wire

        req = _parse(types.SampleRequest, body, "asample")
        if req.sampling_session_id is None:
            raise ApiError(400, "asample: sampling_session_id is required (create a sampling session first)",
                           "sampling_session_id")
        s = self.samplers.get(req.sampling_session_id)
        if s is None:
            raise self._no_sampler(req.sampling_session_id, "asample")
        ids = _token_ids(req.prompt, "prompt")
        sampler = s.sampler
        for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if getattr(req, name):
                raise ApiError(400, f"asample: the local engine does not return {name}", name)
        if req.target_prompt_logprobs is not None:
            raise ApiError(400, "asample: the local engine does not return target_prompt_logprobs", "target_prompt_logprobs")
        if not 1 <= req.num_samples <= MAX_NUM_SAMPLES:
            raise ApiError(400, f"asample: num_samples must be from 1 to {MAX_NUM_SAMPLES}, got {req.num_samples}; "
                                "ask for more in several requests", "num_samples")
        if not ids:
            raise ApiError(400, "asample: the prompt is empty", "prompt")
        bad = [t for t in ids if not 0 <= t < sampler.vocab_size]
        if bad:
            raise ApiError(400, f"asample: token id {bad[0]} is outside the vocabulary of {s.base_model} "
                                f"(0..{sampler.vocab_size - 1})", "prompt")
        if req.prompt_logprobs_last_n is not None and req.prompt_logprobs_last_n < 0:
            raise ApiError(400, f"asample: prompt_logprobs_last_n must be a whole number >= 0 (the prompt tokens "
                                f"whose logprobs to return), got {req.prompt_logprobs_last_n}",
                           "prompt_logprobs_last_n")
        want_prompt_lp = bool(req.prompt_logprobs)
        limit = sampler.block_size if want_prompt_lp else sampler.block_size - 1
        if len(ids) > limit:
            raise ApiError(400, f"asample: the prompt has {len(ids)} tokens; the context of {s.base_model} is "
                                f"{sampler.block_size} tokens", "prompt")
        params = req.sampling_params
        if params.max_tokens is not None and params.max_tokens < 0:
            raise ApiError(400, f"asample: max_tokens must be >= 0, got {params.max_tokens}", "sampling_params.max_tokens")
        if not 0 <= params.temperature < math.inf:  # NaN too
            raise ApiError(400, f"asample: temperature must be a finite number >= 0, got {params.temperature}",
                           "sampling_params.temperature")
        if params.top_p is not None and not 0 < params.top_p <= 1:
            raise ApiError(400, f"asample: top_p must be above 0 and at most 1 (1: no nucleus filter), got "
                                f"{params.top_p}", "sampling_params.top_p")
        _check_seed(params.seed, "asample", "sampling_params.seed")
        from . import check_batch

        try:
            check_batch(s.base_model, [len(ids) + (params.max_tokens or 0)] * req.num_samples, backward=False)
        except EngineError as exc:
            raise ApiError(400, f"asample: {exc}", "num_samples") from None
        seed = params.seed if params.seed is not None else sampler.next_seed()
        # stop=None means the model's end-of-message token, as on Tinker; [] means no stop at all
        stop = params.stop if params.stop is not None else [2]
        seq_ids = [f"{req.sampling_session_id}:{req.seq_id or 0}:{i}" for i in range(req.num_samples)]

        def work() -> tuple[bytes, str]:
            settings = dict(max_tokens=params.max_tokens, temperature=params.temperature, seed=seed, stop=stop,
                            top_k=params.top_k, top_p=params.top_p)
            if not want_prompt_lp:
                seqs, plp = sampler.sample(ids, req.num_samples, **settings), None
            elif len(ids) >= sampler.block_size:  # the prompt fills the context: its logprobs, no reply
                seqs = [_empty_sample() for _ in range(req.num_samples)]
                plp = sampler.prompt_logprobs(ids, req.prompt_logprobs_last_n)
            else:  # e.g. compute_logprobs (a DPO step's reference pass): one forward over the prompt
                seqs, plp = sampler.sample_with_prompt_logprobs(ids, req.num_samples,
                                                                last_n=req.prompt_logprobs_last_n, **settings)
            return wire.encode_sample_response(seqs, plp), wire.CONTENT_TYPE

        fut = s.submit("asample", work)
        return {"request_id": fut.request_id, "sample_sequence_ids": seq_ids}

    # -- futures
    def retrieve_future(self, q: dict, body: Any) -> tuple[int, bytes, str] | dict:
        from tinker import types

        req = _parse(types.FutureRetrieveRequest, body, "retrieve_future")
        fut = self.futures.get(req.request_id)
        if fut is None:
            raise ApiError(404, f"retrieve_future: no request {req.request_id!r} on this server (was it restarted?)",
                           "request_id")
        fut.polls += 1
        if not self._wait(fut):
            if self._stopping.is_set():
                failed = {"error": f"{fut.call}: the server stopped before this request finished; start it "
                                   "again and resume from the last checkpoint", "category": "server"}
                return 200, json.dumps(failed).encode("utf-8"), "application/json"
            # 408 with the try_again body, as Tinker answers it: the SDK polls again without a word
            # (a 200 try_again makes it log a "Retrying request …" warning each time)
            again = {"type": "try_again", "request_id": req.request_id, "queue_state": "active"}
            return 408, json.dumps(again).encode("utf-8"), "application/json"
        return 200, fut.body, fut.content_type

    def _wait(self, fut: _Future) -> bool:
        """Wait up to LONG_POLL_S for `fut`, waking early when the server stops; whether it is done."""
        deadline = time.monotonic() + LONG_POLL_S
        while not fut.done.wait(min(0.25, max(0.0, deadline - time.monotonic()))):
            if self._stopping.is_set() or time.monotonic() >= deadline:
                return fut.done.is_set()
        return True

    # -- REST lookups
    def _run_record(self, run_id: str, call: str) -> dict:
        """The run's run.json (`checkpoints.read_run_record`), else one made from a checkpoint of a
        run that has none; 404 for no such run, a 400 naming the file and field for a damaged record."""
        try:
            directory = ck.run_dir(self.data_dir, run_id)
        except EngineError as exc:
            raise ApiError(404, str(exc)) from None
        if (directory / "run.json").is_file():
            try:
                return ck.read_run_record(directory)
            except MachineFormatError as exc:
                raise _damaged(call, exc, None) from None
        for sub in ("weights", "sampler_weights"):
            for d in _folders(directory / sub):
                if not d.name.startswith(".") and ck.not_a_checkpoint(d) is None:
                    try:
                        meta = ck.read_meta(d)
                        created = d.stat().st_mtime
                    except (MachineFormatError, FileNotFoundError):  # damaged or deleted meanwhile
                        continue
                    return {"training_run_id": run_id, "base_model": meta["base_model"],
                            "lora_rank": meta["lora_rank"], "user_metadata": meta.get("user_metadata") or {},
                            "created": created}
        raise ApiError(404, f"{call}: no training run {run_id!r} on this server")

    def _checkpoints(self, run_id: str) -> list[dict]:
        """The run's checkpoints, by kind and name; one deleted while they are listed is left out."""
        import datetime as dt

        directory = ck.run_dir(self.data_dir, run_id)
        out = []
        for sub, kind in ck.KINDS.items():
            for d in _folders(directory / sub):
                found = None if d.name.startswith(".") else ck.checkpoint_files(d)
                if found is None:
                    continue
                size, written = found
                when = dt.datetime.fromtimestamp(written, dt.timezone.utc)
                out.append({"checkpoint_id": f"{sub}/{d.name}", "checkpoint_type": kind,
                            "time": when.isoformat(), "tinker_path": ck.tinker_path(run_id, sub, d.name),
                            "size_bytes": size})
        return out

    def get_training_run(self, run_id: str) -> dict:
        import datetime as dt

        record = self._run_record(run_id, "get_training_run")
        run = self.runs.get(run_id)
        last = run.last_request if run is not None else record.get("created")
        last = time.time() if last is None else last
        cps = self._checkpoints(run_id)
        training = [c for c in cps if c["checkpoint_type"] == "training"]
        sampler = [c for c in cps if c["checkpoint_type"] == "sampler"]
        meta = {str(k): str(v) for k, v in (record.get("user_metadata") or {}).items()}
        return {"training_run_id": run_id, "base_model": record["base_model"], "model_owner": "local",
                "is_lora": int(record.get("lora_rank") or 0) > 0, "lora_rank": record.get("lora_rank") or None,
                "last_request_time": dt.datetime.fromtimestamp(last, dt.timezone.utc).isoformat(),
                "last_checkpoint": max(training, key=lambda c: c["time"]) if training else None,
                "last_sampler_checkpoint": max(sampler, key=lambda c: c["time"]) if sampler else None,
                "user_metadata": meta or None}

    def _run_ids(self) -> list[str]:
        """The runs in the data dir; what is not a run is skipped, with a warning in the log."""
        return ck.run_ids(self.data_dir, lambda line: logger.warning("local server: %s", line))

    def list_training_runs(self, q: dict, body: Any) -> dict:
        ids = self._run_ids()
        limit, offset = _count(q, "limit", 20), _count(q, "offset", 0)
        runs = []
        for i in ids[offset:offset + limit]:
            try:
                runs.append(self.get_training_run(i))
            except (ApiError, OSError) as exc:
                logger.warning("local server: run %s skipped: %s", i, getattr(exc, "message", exc))
        return {"training_runs": runs, "cursor": {"offset": offset, "limit": limit, "total_count": len(ids)}}

    def list_checkpoints(self, run_id: str) -> dict:
        self._run_record(run_id, "list_checkpoints")
        return {"checkpoints": self._checkpoints(run_id)}

    def list_all_checkpoints(self, q: dict, body: Any) -> dict:
        cps = []
        for run_id in self._run_ids():
            try:
                cps.extend(self._checkpoints(run_id))
            except (ApiError, OSError) as exc:
                logger.warning("local server: run %s skipped: %s", run_id, getattr(exc, "message", exc))
        return {"checkpoints": cps}

    def weights_info(self, q: dict, body: Any) -> dict:
        from .checkpoints import read_meta

        path = (body or {}).get("tinker_path") if isinstance(body, dict) else None
        if not isinstance(path, str):
            raise ApiError(400, "weights_info: tinker_path is required", "tinker_path")
        directory = self._checkpoint_dir(path, "weights_info", "tinker_path")
        try:
            meta = read_meta(directory)
        except MachineFormatError as exc:
            raise _damaged("weights_info", exc, "tinker_path") from None
        targets = meta.get("targets") or {}
        return {"base_model": meta["base_model"], "is_lora": int(meta["lora_rank"]) > 0,
                "lora_rank": int(meta["lora_rank"]) or None, "train_unembed": bool(targets.get("unembed", False)),
                "train_mlp": targets.get("mlp", True), "train_attn": targets.get("attn", True)}

    def delete_checkpoint(self, run_id: str, checkpoint_id: str) -> dict:
        """Delete a checkpoint's folder. A folder that is a link loses the link only: what it leads
        to stays, wherever it is. A checkpoint deleted meanwhile by another request counts as deleted."""
        import shutil

        parts = checkpoint_id.split("/")
        if len(parts) != 2 or parts[0] not in ck.KINDS:
            raise ApiError(400, f"delete_checkpoint: not a checkpoint id: {checkpoint_id!r}", "checkpoint_id")
        path = ck.tinker_path(run_id, parts[0], parts[1])
        directory = self._checkpoint_dir(path, "delete_checkpoint", "checkpoint_id", delete=True)
        try:
            if directory.is_symlink():
                directory.unlink()
            else:
                shutil.rmtree(directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ApiError(409, f"delete_checkpoint: {path} could not be deleted from {directory} "
                                f"({exc.strerror or exc}); delete the folder yourself", "checkpoint_id") from None
        return {}


def _folders(directory: Path) -> list[Path]:
    """The entries of `directory`, sorted; none when it does not exist (or was deleted meanwhile)."""
    try:
        return sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _count(query: dict, name: str, default: int) -> int:
    """A whole number >= 0 from the query string; a 400 naming it otherwise."""
    raw = (query.get(name) or [str(default)])[0]
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ApiError(400, f"{name} must be a whole number >= 0, got {raw!r}", name)
    return value


def _empty_sample() -> Any:
    from .compute import Sample

    return Sample([], [], "length")


# ---------------------------------------------------------------------------------------------
# HTTP: uvicorn (its httptools parser) frames requests; a small ASGI app checks the key, reads the body and hands
# the request to `LocalServer.dispatch` on a worker thread (handlers block: long-polls, disk)


#: Requests answered on the event loop itself: they read memory only, never wait or touch disk.
_INLINE = frozenset({"/api/v1/healthz", "/api/v1/client/config", "/api/v1/client/dynamic_config",
                     "/api/v1/session_heartbeat", "/api/v1/telemetry", "/api/v1/get_info",
                     "/api/v1/create_session", "/api/v1/get_server_capabilities"})


class _Headers(dict):
    """Request headers by lower-case name (`get` takes any case)."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


class _Threads:
    """Daemon threads that run blocking calls for the event loop: an idle one takes the next call,
    and a new one starts when none is idle (a long-poll holds its thread while it waits)."""

    def __init__(self, name: str, most: int = 512):
        import queue

        self._jobs: "queue.SimpleQueue[tuple[Callable, Any, Any] | None]" = queue.SimpleQueue()
        self._idle = 0
        self._count = 0
        self._most = most
        self._name = name
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        import asyncio

        loop = asyncio.get_running_loop()
        done = loop.create_future()
        with self._lock:
            grow = self._idle == 0 and self._count < self._most
            if grow:
                self._count += 1
            else:
                self._idle -= 1
        self._jobs.put((fn, loop, done))
        if grow:
            threading.Thread(target=self._work, name=f"{self._name}-{self._count}", daemon=True).start()
        return done

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, loop, done = job
            try:
                value, error = fn(), None
            except BaseException as exc:  # handed to the event loop below
                value, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, done, value, error)
            except RuntimeError:  # the loop has ended (the server stopped)
                pass
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        with self._lock:
            count, self._count = self._count, 0
        for _ in range(count):
            self._jobs.put(None)


def _settle(done: Any, value: Any, error: BaseException | None) -> None:
    if done.done():  # the request was cancelled (its client went away)
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(value)


class _App:
    """The ASGI application in front of a LocalServer. A body is read as JSON whatever its
    Content-Type says, except on the protobuf calls (`_PROTOBUF_CALLS`)."""

    def __init__(self, server: "LocalServer"):
        self.server = server
        self.threads = _Threads("local-http")
        self._loop: Any = None
        self._reading: set = set()  # the tasks of the requests whose body is arriving (the loop's own)
        self._cut = False

    def listen_for_stop(self, loop: Any) -> None:
        """Called with the server's event loop before it serves, so that `stop()` reaches it."""
        self._loop = loop

    def stop(self) -> None:
        """Answer every request whose body has not all arrived with a 503 (the server stopped),
        so the shutdown does not wait for the rest of a body that a client may never send."""
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._cut_bodies)
        except RuntimeError:  # the loop has ended
            pass

    def _cut_bodies(self) -> None:
        # on the loop: a task in _reading is suspended in _body's one await, so that is where
        # the cancellation lands
        self._cut = True
        for task in list(self._reading):
            task.cancel()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        headers = _Headers((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"])
        app = self.server
        try:
            # before anything else of the request is read
            app.check_key(path, headers.get("x-api-key"), authorization=headers.get("authorization") is not None)
            length = headers.get("content-length")
            if length is not None and int(length) > MAX_BODY_BYTES:
                raise ApiError(413, f"{method} {path}: the body has {length} bytes; this server accepts at most "
                                    f"{MAX_BODY_BYTES}")
            raw = await self._body(receive, method, path)
        except ApiError as exc:
            return await self._send(send, *_error_answer(exc), close=True)
        if raw is None:  # the client went away
            return
        if not app.quiet:
            logger.info("local server: %s %s", method, path)  # method and path only: never headers (the key)
        body: Any = None
        if raw and path not in _PROTOBUF_CALLS:  # JSON whatever its Content-Type says (curl -d sends a form's)
            from ...core.jsonl import parse_json  # bounded: a hostile nesting is a 400, never a RecursionError

            kind = headers.get("content-type") or ""
            sent_as = "" if "json" in kind else f"; it was sent as {kind or 'no Content-Type'}, this call takes JSON"
            try:
                body = parse_json(raw)
            except MachineFormatError as exc:  # a number too long to read too
                return await self._send(send, *_error_answer(ApiError(
                    400, f"{method} {path}: the body is not valid JSON ({exc.reason}){sent_as}", exc.field)))
        try:
            if path in _INLINE:
                answer = app.dispatch(method, path, query, body, raw, headers)
            else:
                answer = await self.threads.run(lambda: app.dispatch(method, path, query, body, raw, headers))
        except ApiError as exc:
            answer = _error_answer(exc)
        except Exception as exc:  # a defect: a 4xx the SDK raises at once, never a retried 5xx
            logger.error("local server: %s %s failed\n%s", method, path,
                         "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            answer = _error_answer(ApiError(400, f"{method} {path}: internal error of the local engine: "
                                                 f"{type(exc).__name__}: {exc}"))
        await self._send(send, *answer)

    async def _body(self, receive: Callable, method: str, path: str) -> bytes | None:
        """The request's body; None when the client went away; a 503 when the server stops first
        (`stop`)."""
        import asyncio

        chunks, total = [], 0
        task = asyncio.current_task()
        self._reading.add(task)
        try:
            while True:
                if not self._cut:
                    message = await receive()
                else:  # a request begun after the cut (a kept-alive connection) gets a second for its body
                    message = await asyncio.wait_for(receive(), 1.0)
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                total += len(chunk)
                if total > MAX_BODY_BYTES:
                    raise ApiError(413, f"{method} {path}: the body is over {MAX_BODY_BYTES} bytes, the most this "
                                        "server accepts")
                chunks.append(chunk)
                if not message.get("more_body"):
                    return b"".join(chunks)
        except (asyncio.CancelledError, TimeoutError) as exc:
            if not self._cut:  # the shutdown's own cancellation, after its grace
                raise
            if isinstance(exc, asyncio.CancelledError):
                task.uncancel()
            raise ApiError(503, f"{method} {path}: the server stopped before the request's body had all "
                                "arrived") from None
        finally:
            self._reading.discard(task)

    @staticmethod
    async def _send(send: Callable, status: int, body: bytes, content_type: str, extra: tuple = (),
                    close: bool = False) -> None:
        headers = [(b"content-type", content_type.encode("latin-1")), (b"content-length", str(len(body)).encode()),
                   *extra]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _error_answer(exc: ApiError) -> tuple[int, bytes, str, tuple]:
    """(status, JSON body, content type, headers) of an error; a 405 names the methods it takes (Allow)."""
    payload = {"detail": exc.message, "field": exc.field, **exc.extra}
    headers: tuple = ((b"x-should-retry", b"false"),)
    if exc.status == 405:
        headers += ((b"allow", ", ".join(exc.extra.get("allow", ())).encode("latin-1")),)
    return exc.status, json.dumps(payload).encode("utf-8"), "application/json", headers


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when the host is an IPv6 address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # an answer goes out as two writes (head, body): with Nagle's algorithm the second waits
        # for the client's delayed ACK. Accepted connections inherit this option.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


# ---------------------------------------------------------------------------------------------
# the process's own server


_DEFAULT: LocalServer | None = None
_DEFAULT_LOCK = threading.Lock()
# every server this process started with `start()` and has not stopped, by URL
_RUNNING: dict[str, LocalServer] = {}
_RUNNING_LOCK = threading.Lock()


def running_at(url: str) -> LocalServer | None:
    """The server this process runs at `url` (started with `start()`, not yet stopped), else None."""
    with _RUNNING_LOCK:
        return _RUNNING.get(str(url).rstrip("/"))


def default_server() -> LocalServer | None:
    """The server `ensure_server()` started in this process, else None (this starts nothing)."""
    return _DEFAULT


def ensure_server() -> LocalServer:
    """The server this process's `engine="local"` calls use: started on a free loopback port the
    first time it is needed, with the process's key (`checkpoints.PROCESS_KEY`), reused afterwards, stopped when the interpreter exits (after
    machine_nb's SDK sessions on it are finished: `LocalServer.on_stop`). It runs in this process
    (a thread), so it can never outlive it. One stopped by other means than the toolkit's own
    (`default_server().stop()`) is replaced by a new one."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None or _DEFAULT.stopped:
            first = _DEFAULT is None
            _DEFAULT = LocalServer(key=ck.PROCESS_KEY).start()
            if first:
                from .workarounds import before_executors_shut_down

                before_executors_shut_down(_stop_default_at_exit)
        return _DEFAULT


def _forget_in_child() -> None:
    """In a forked child: the parent's servers are not this process's (their threads did not come
    along), so there is nothing here to stop or reuse; a call in the child starts its own."""
    global _DEFAULT, _DEFAULT_LOCK, _RUNNING_LOCK
    _DEFAULT = None
    _DEFAULT_LOCK, _RUNNING_LOCK = threading.Lock(), threading.Lock()
    _RUNNING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _stop_default_at_exit() -> None:
    """Stop the process's server as the interpreter exits, unless work may still come to it: a
    request in progress, or a thread of the user's still running (Python joins non-daemon threads
    only after this runs). Then it stops after they are done, from `atexit`, without finishing the
    SDK sessions on it: that needs executors, shut by then, and the process ends at once anyway,
    its clients' heartbeats with it (they warn only after two minutes of failures)."""
    server = _DEFAULT
    if server is None:
        return
    from .workarounds import executor_threads

    pool_threads = executor_threads()  # executors' own workers: Python joins them itself
    running = [t for t in threading.enumerate() if t.is_alive() and not t.daemon
               and t is not threading.current_thread() and t not in pool_threads]
    if running or server.busy():
        import atexit

        atexit.register(_stop_default, notify=False)
        return
    _stop_default()


def _stop_default(notify: bool = True) -> None:
    global _DEFAULT
    with _DEFAULT_LOCK:
        server, _DEFAULT = _DEFAULT, None
    if server is not None:
        try:
            server.stop(notify=notify)
        except Exception:  # interpreter shutdown: nothing left to report to
            pass


class _StopSignals:
    """Ctrl-C and SIGTERM, from now until `close()`, as a stop request that `wait` returns.

    A Python signal handler runs in the main thread between two of its bytecodes, possibly while
    that thread holds a lock inside its own wait (a `threading.Event`'s, say): a handler that took
    the same lock would hang the process for good. So the handlers here take no lock: they write a
    byte to a socket pair, and `wait` blocks in `select` on its other end. Off the main thread
    (where signals cannot be caught) it installs nothing and `wait` only times out."""

    def __init__(self) -> None:
        import signal

        self._previous: dict = {}
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        try:
            self._write.send(b"\0")
        except OSError:  # the pair is full (a stop is asked already) or closed
            pass

    def wait(self, timeout: float) -> bool:
        """Whether a stop was asked, waiting up to `timeout` seconds for one."""
        import select

        return bool(select.select([self._read], [], [], timeout)[0])

    def close(self) -> None:
        """Put the previous handlers back and close the pair."""
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        self._read.close()
        self._write.close()


def serve(host: str = "127.0.0.1", port: int = 8000, *, data_dir: str | os.PathLike | None = None,
          key: str | None = None, threads: int | None = None, verbose: bool = False,
          announce: Callable[[str], None] = print, train_workers: int | None = None) -> None:
    """Run the server in the foreground until Ctrl-C or SIGTERM (what `machine-nb serve` does): the
    requests in progress are answered, the workers end, and the call returns. `train_workers`:
    training processes (LocalServer's; default one fewer than the cores, workers.default_workers())."""
    if key is None and _is_loopback(host):
        directory = Path(data_dir).expanduser().absolute() if data_dir is not None else ck.default_data_dir()
        key, key_file = ck.data_dir_key(ck.ensure_private_dir(directory))
        note = (f"every request must send the key in {key_file} as its API key: "
                f"TINKER_API_KEY=$(cat {key_file})")
    else:
        note = "every request must send the key it was given as its API key (TINKER_API_KEY)"
    if train_workers is None:
        from .workers import default_workers

        train_workers = default_workers()
    server = LocalServer(host, port, data_dir=data_dir, key=key, threads=threads, quiet=not verbose,
                         train_workers=train_workers)
    server.sdk_in_process = False  # its clients are other processes: they read the hub cache
    if verbose:
        logging.basicConfig(level=logging.INFO)
    stop = _StopSignals()
    try:
        server.start()
        server.capabilities({}, None)  # loads what the first requests need, so "ready" means ready
        import sys

        from . import DEFAULT_MODEL, describe_devices

        server._tokenizer_by_name(DEFAULT_MODEL)  # `AutoTokenizer.from_pretrained` finds it by name offline

        print(note, file=sys.stderr, flush=True)  # names the key's file, never the key
        # which device and dtype each model runs on; the ready line below stays "… on URL" alone,
        # so a script can take the URL from its end
        print(f"models: {describe_devices()}", file=sys.stderr, flush=True)
        announce(f"serving the Tinker API on {server.url}")
        while not stop.wait(0.5) and server._thread is not None and server._thread.is_alive():
            pass
    finally:
        server.stop()  # requests in progress are answered first
        stop.close()
