"""Sidecar client: send sketches to `optwin serve` without ever blocking the model.

    python -c "from optwin.fingerprints.client import SidecarClient; c = SidecarClient('tcp://127.0.0.1:8765'); print(c.health())"

`observe(...)` puts a record on a bounded queue and returns at once (False when the queue is full:
the record is dropped and counted). A background thread batches the queue (up to `batch_size`
records per POST /v1/observe), keeps one HTTP/1.1 keep-alive connection, and reconnects with
backoff when the sidecar goes away (a batch in flight then is counted as `failed`). Answers with
`warn` go to `on_warning` callbacks, every answer to `on_answer` callbacks (a caller that follows
episodes needs the warn=False answers too); 503 answers (the sidecar is overloaded) are counted as
`rejected`. Nothing here raises into the caller's thread.

What fails is also told, on logging 'optwin.client' at WARNING, from the sender thread (never the caller's):
the sidecar unreachable (with the reason: connection refused, timed out), a request it refuses (HTTP 401: no
or the wrong token), overload (503), a record it answers with an error (its error text), records dropped on a
full queue. Each kind's first at once, then at most one line per `warn_every_s` (60 s) with how many records
it hit since: a pointer at the wrong port or a forgotten token otherwise lost every warning in silence.
"""

from __future__ import annotations

import http.client
import json
import logging
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from optwin.fingerprints.sidecar import Address, _dumps, _loads, parse_listen

log = logging.getLogger("optwin.client")


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


def connect(address: Address, timeout: float) -> http.client.HTTPConnection:
    if address.kind == "unix":
        return _UnixHTTPConnection(address.path, timeout)
    conn = http.client.HTTPConnection(address.host, address.port, timeout=timeout)
    return conn


class HTTP:
    """One keep-alive connection with a `request` that reconnects once on a stale socket."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 5.0) -> None:
        self.address = parse_listen(url)
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = connect(self.address, self.timeout)
                if self.address.kind == "tcp":
                    self._conn.connect()
                    self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                self._conn.request(method, path, body=body, headers=self.headers)
                resp = self._conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    self.close()
                return resp.status, data
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt:
                    raise
            except (OSError, http.client.HTTPException):
                self.close()
                raise
        raise ConnectionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


@dataclass
class ClientStats:
    queued: int = 0
    sent: int = 0  # records the sidecar answered
    dropped: int = 0  # queue full: never sent
    failed: int = 0  # in a batch whose request failed (sidecar down, timeout)
    rejected: int = 0  # in a batch the sidecar refused with 503 (overloaded)
    errors: int = 0  # answered with {"error": ...}
    warnings: int = 0
    reconnects: int = 0
    latencies_s: list[float] = field(default_factory=list)  # per request, when record_latency


def _reason(e: BaseException) -> str:
    """One line for a failed request: 'Connection refused', 'timed out', 'No such file or directory'."""
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def _error_text(body: bytes) -> str:
    """The sidecar's {"error": ...} text of a refusal, else the start of whatever came back."""
    try:
        ans = json.loads(body)
    except ValueError:
        ans = None
    if isinstance(ans, dict) and isinstance(ans.get("error"), str):
        return ans["error"][:300]
    text = body[:120].decode("utf-8", "replace").strip()
    return repr(text) if text else "(no body)"


class _Reports:
    """Failures told at WARNING, rate-limited per kind: the first at once, then at most one line per `every_s`
    with how many records the kind hit since the last line. A dead sidecar fails every batch, so a line per
    failure would flood the log of a busy model; none at all hid a wrong port or a missing token. Called from
    sender threads, and there can be two: `reopen()` starts a new sender while the old one still times out
    against a hung sidecar. Unlocked, both could pass the rate check at once and the second pop raised
    KeyError, killing its sender (every later record dropped)."""

    def __init__(self, url: str, every_s: float) -> None:
        self.url = url
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # kind -> monotonic time of its last line
        self._since: dict[str, int] = {}  # kind -> records since that line
        self._total: dict[str, int] = {}

    def tell(self, kind: str, n: int, what: str) -> None:
        with self._lock:
            self._since[kind] = self._since.get(kind, 0) + n
            self._total[kind] = self._total.get(kind, 0) + n
            now = time.monotonic()
            last = self._last.get(kind)
            if last is not None and now - last < self.every_s:
                return
            self._last[kind] = now
            since, total = self._since.pop(kind), self._total[kind]
        if last is None:
            tail = f"{total} record(s) so far; told again at most every {self.every_s:g} s"
        else:
            tail = f"{since} record(s) since the last report, {total} in all"
        log.warning("optwin sidecar %s %s (%s)", self.url, what, tail)


class SidecarClient:
    """Fire-and-forget client with a bounded queue and a sender thread."""

    def __init__(self, url: str, token: str | None = None, queue_size: int = 10000, batch_size: int = 256,
                 timeout_s: float = 2.0, on_warning: Callable[[dict[str, Any]], None] | None = None,
                 record_latency: bool = False, on_answer: Callable[[dict[str, Any]], None] | None = None,
                 warn_every_s: float = 60.0) -> None:
        self.http = HTTP(url, token=token, timeout=timeout_s)
        self.reports = _Reports(str(self.http.address), warn_every_s)
        self._full = 0  # records dropped on a full queue (stats.dropped also counts those put after close)
        self._full_told = 0
        self.batch_size = batch_size
        self.stats = ClientStats()
        self.record_latency = record_latency
        self._callbacks = [on_warning] if on_warning else []
        self._answer_callbacks = [on_answer] if on_answer else []
        self._queue_size = queue_size
        self._start()

    def _start(self) -> None:
        """A fresh queue, idle flag, stop flag and sender thread. Each sender gets its own (and its own
        connection) as arguments: one that outlives close()'s join (a request still timing out) drains
        only its own queue and exits, never the queue a reopen() started."""
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=self._queue_size)
        self._closed = False
        self._idle = threading.Event()
        self._idle.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._q, self._idle, self._stop, self.http),
                                        name="optwin-sidecar-client", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ producer side (model thread)

    def observe(self, stream: str, op: str, variant: str, dtype: str, sketch: dict[str, float],
                params: dict[str, Any] | None = None, t: float | None = None) -> bool:
        """Queue one record; never blocks. False when dropped (queue full or client closed)."""
        rec = {"stream": stream, "op": op, "variant": variant, "dtype": dtype, "sketch": sketch,
               "params": params or {}, "t": time.monotonic() if t is None else t}
        return self.put(rec)

    def put(self, rec: dict[str, Any]) -> bool:
        if self._closed:
            self.stats.dropped += 1
            return False
        try:
            self._q.put_nowait(rec)
        except queue.Full:
            self.stats.dropped += 1
            self._full += 1  # told by the sender thread: no logging on the caller's thread
            return False
        self._idle.clear()
        self.stats.queued += 1
        return True

    def add_callback(self, fn: Callable[[dict[str, Any]], None]) -> None:
        self._callbacks.append(fn)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far was sent (or failed). True when drained in time."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self._q.empty() and self._idle.is_set():
                return True
            time.sleep(0.002)
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    def reopen(self) -> None:
        """Send again after close() (a monitor stopped and started again): a new queue, connection and
        sender thread; stats and callbacks carry on. No-op while open."""
        if not self._closed:
            return
        old = self.http
        self.http = HTTP(str(old.address), timeout=old.timeout)
        self.http.headers = dict(old.headers)
        self._start()

    def close(self, timeout: float = 5.0) -> None:
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._stop.set()
        try:
            self._q.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self.http.close()

    # ------------------------------------------------------------------ synchronous helpers

    def health(self) -> dict[str, Any]:
        """GET /healthz on a connection of its own: `{"code": 200, "status": "ok", "build_id": ...}` from a ready
        sidecar, `{"code": 401, "error": ...}` and the like from one that refuses. Like the rest of the client it
        never raises (it is called from the model's process, e.g. to check before serving): a sidecar that cannot
        be reached is `{"code": None, "status": "unreachable", "error": "<one line>"}`, and an answer that is not
        a JSON object keeps its code with `"status": "error"`."""
        address = str(self.http.address)
        conn = HTTP(address, timeout=self.http.timeout)
        conn.headers = dict(self.http.headers)
        try:
            code, body = conn.request("GET", "/healthz")
        except (OSError, http.client.HTTPException) as e:  # refused, timed out, reset, not HTTP at all
            return {"code": None, "status": "unreachable", "error": f"cannot reach {address}: {_reason(e)}"}
        finally:
            conn.close()
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):  # something other than optwin serve on that address
            return {"code": code, "status": "error", "error": f"{address} answered /healthz with no JSON object"}
        return {"code": code, **answer}

    # ------------------------------------------------------------------ sender thread

    def _run(self, q: queue.Queue, idle: threading.Event, stop: threading.Event, conn: HTTP) -> None:
        backoff = 0.05
        while True:
            if self._full != self._full_told:
                n, self._full_told = self._full - self._full_told, self._full
                self.reports.tell("dropped", n, f"records dropped: the client's queue is full ({self._queue_size} records)")
            try:
                first = q.get(timeout=0.1)
            except queue.Empty:
                idle.set()
                if stop.is_set():  # closed with a full queue: no sentinel came
                    return
                continue
            if first is None:
                idle.set()
                return
            batch = [first]
            while len(batch) < self.batch_size:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop.set()
                    break
                batch.append(nxt)
            try:
                t0 = time.perf_counter()
                code, body = conn.request("POST", "/v1/observe", _dumps(batch))
                if self.record_latency:
                    self.stats.latencies_s.append(time.perf_counter() - t0)
                backoff = 0.05
            except (OSError, http.client.HTTPException) as e:
                self.stats.failed += len(batch)
                self.stats.reconnects += 1
                self.reports.tell("unreachable", len(batch),
                                  f"unreachable ({_reason(e)}): records are not sent and its warnings are lost")
                self._drain_while_down(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            if code == 503:
                self.stats.rejected += len(batch)
                self.reports.tell("overloaded", len(batch), f"overloaded, records not assessed: HTTP 503 "
                                                            f"{_error_text(body)}")
                time.sleep(0.01)
            elif code != 200:
                self.stats.failed += len(batch)
                hint = ("; pass the sidecar's --token as token= (optwin.monitor(..., token=...))"
                        if code in (401, 403) else "")
                self.reports.tell(f"http {code}", len(batch),
                                  f"refused POST /v1/observe: HTTP {code} {_error_text(body)}{hint}")
            else:
                self._answers(batch, body)
            if q.empty():
                idle.set()
                if stop.is_set():
                    return

    def _drain_while_down(self, seconds: float) -> None:
        """Sleep through a backoff without letting the queue fill with stale records... nor block."""
        time.sleep(seconds)

    def _answers(self, batch: list[dict[str, Any]], body: bytes) -> None:
        try:
            answers = _loads(body)
        except ValueError:
            self.stats.failed += len(batch)
            self.reports.tell("answer", len(batch), f"answered POST /v1/observe with no JSON list: "
                                                    f"{_error_text(body)}")
            return
        self.stats.sent += len(batch)
        for rec, ans in zip(batch, answers):
            if "error" in ans:
                self.stats.errors += 1
                self.reports.tell("record", 1, f"rejected a record of stream {rec.get('stream')!r} "
                                               f"({rec.get('op')}/{rec.get('variant')}/{rec.get('dtype')}): "
                                               f"{str(ans['error'])[:300]}")
                continue
            warn = ans.get("warn")
            if warn:
                self.stats.warnings += 1
            fns = (self._callbacks if warn else []) + self._answer_callbacks
            if not fns:
                continue
            full = {**ans, "op": rec["op"], "variant": rec["variant"], "dtype": rec["dtype"], "t": rec["t"]}
            for fn in fns:
                try:
                    fn(full)
                except Exception:  # a broken callback must not stop the sender
                    log.exception("sidecar answer callback failed")
