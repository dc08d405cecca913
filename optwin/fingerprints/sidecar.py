"""The online prediction sidecar: `optwin serve`, HTTP/1.1 + JSON over asyncio streams.

    optwin serve --db fingerprints.duckdb --listen tcp://127.0.0.1:8765 --warnings-jsonl warnings.jsonl

Protocol (shared/spec/api.md, "Sidecar protocol"):
- POST /v1/observe: one record or a JSON list of records {stream, op, variant, dtype, sketch,
  params, t} (t, the producer's seconds, is required); answers a list of {stream, warn, probability, known,
  eta_s} in the same order; a malformed record gets {"error": "..."} in its place and the rest are served.
- GET /v1/warnings?since=SEQ: warnings (stream warning episodes) with seq > SEQ, oldest first.
- GET /metrics: Prometheus text. GET /healthz: 200 {"status": "ok", "build_id": ..., "twin_versions": {build: twin
  version}, "twin_version_mismatch": bool} (true: some fingerprints served come from another twin version).

Why plain asyncio: the work per record is a few dict lookups (the matcher's index) and a short
trend fit, so the server's cost is parsing. A hand-written HTTP/1.1 keep-alive loop over
`asyncio.start_server` costs a few microseconds per request; clients batch records (client.py
sends up to 256 per request), so one core serves tens of thousands of records per second.

Backpressure: the server never queues unboundedly. Request bodies (Content-Length or chunked) are capped
(`max_body`, 413); when the event loop lags more than `max_lag_s` behind (it is saturated) or the configured record
rate is exceeded, POST /v1/observe answers 503 at once (counted, exported) so clients drop instead
of piling up. The client (client.py) never blocks the model either: bounded queue, counted drops.
Streams are bounded too: at `max_streams` the least recently seen stream is dropped for a new one, and with
`stream_ttl_s` streams quiet that long are dropped (both counted in /metrics).

Hot reload: the database path is polled (inode, mtime, size); on a change the new file is loaded in
a worker thread and swapped in; the streams keep their history. A file that fails to load is
logged and counted, and the old index keeps serving.

Security: any listen address other than loopback (or a unix socket) needs `--token`; then every
request must carry `Authorization: Bearer TOKEN` (401 otherwise).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import signal
import socket
import stat
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, AsyncIterator
from urllib.parse import parse_qs

from optwin.catalog import check_variant_dtype
from optwin.errors import OptwinError, first_line
from optwin.fingerprints.forecast import ForecastConfig, Stream
from optwin.fingerprints.matcher import Matcher, MatcherConfig, fast_validate_sketch


def _parse_int(s: str) -> int | float:
    """A JSON integer; past Python's int digit limit (4300 digits) a float (inf), so the one record holding it gets
    its own error where int() failed the whole body with 400."""
    try:
        return int(s)
    except ValueError:
        return float(s)


def _json_loads(b: bytes) -> Any:
    return json.loads(b, parse_int=_parse_int)


try:  # optional: 3-5x faster JSON; the stdlib serves the same bytes without it
    import orjson as _orjson

    def _loads(b: bytes) -> Any:
        try:
            return _orjson.loads(b)
        except _orjson.JSONDecodeError:
            # orjson refuses numbers beyond double range (1e400, a 400-digit integer) and NaN/Infinity literals;
            # the stdlib reads them (as inf/nan, or an int), so such records get their own error in place.
            return _json_loads(b)

    def _dumps(o: Any) -> bytes:
        try:
            return _orjson.dumps(o)
        except TypeError:  # lone surrogates in a client's strings: the stdlib escapes them
            return json.dumps(o, separators=(",", ":")).encode()
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

    def _loads(b: bytes) -> Any:
        return _json_loads(b)

    def _dumps(o: Any) -> bytes:
        return json.dumps(o, separators=(",", ":")).encode()

log = logging.getLogger("optwin.sidecar")

_INF = math.inf
_LAT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
            501: "Not Implemented", 503: "Service Unavailable"}

# A chunk-size line (RFC 9112 7.1): hex digits, then extensions (";name=value", optionally after spaces), which are
# ignored. Only hex digits, where int(x, 16) alone would also take "0x1f", "+1f", "1_f" or " 1f": lenient size
# parsing is how a front-end and a back-end come to disagree on where a body ends (request smuggling). At most 16
# digits (a size below 2**64), and a bare LF is not a line end, for the same reason.
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r\n")
_MAX_CHUNK_LINE = 4096  # bytes of one chunk-size line, extensions included
_MAX_TRAILERS = 1 << 16  # bytes of a chunked body's trailer section (the head's own limit)
_PIECE = 1 << 20  # a body is read in pieces of at most this many bytes, so a refused one is never held whole


class ListenError(OptwinError, ValueError):
    """A listen address the sidecar cannot or must not use."""


@dataclass(frozen=True)
class SidecarConfig:
    max_body: int = 8 << 20  # bytes per request
    # Of a body refused as too large, up to this many bytes are read and dropped before the connection closes, so
    # that the client, still sending, reads the 413 (a close with unread input resets the connection, and the client
    # sees a broken pipe instead of the answer). Beyond it the connection is closed under the client, as before.
    max_discard: int = 64 << 20
    max_records: int = 10000  # records per request
    # Streams kept (~5 KB each); at the cap the least recently seen stream is dropped for a new one, so a new stream
    # is always answered (a stream that comes back after eviction starts a fresh history).
    max_streams: int = 200_000
    # A stream not seen for this many seconds is dropped (None: only the cap drops streams). Checked at most once a
    # second, from the least recently seen end, so the cost is the streams dropped.
    stream_ttl_s: float | None = None
    max_lag_s: float = 0.5  # smoothed event-loop lag beyond which /v1/observe answers 503
    max_records_per_s: float | None = None  # optional hard cap (token bucket)
    reload_poll_s: float = 0.5
    warnings_kept: int = 10000  # for /v1/warnings
    # A connection must deliver each request (head and body) within this many seconds of the previous answer, or
    # it is closed: a client that sends half a head and stalls would otherwise hold its connection for ever. Idle
    # keep-alive connections close after it too (nginx keeps 75 s); SidecarClient reconnects on its next batch.
    request_timeout_s: float = 60.0


@dataclass(frozen=True)
class Address:
    kind: str  # "tcp" | "unix"
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6: what parse_listen reads back
        return f"tcp://{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        if self.kind == "unix":
            return True
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_listen(listen: str) -> Address:
    """'tcp://HOST:PORT' or 'unix:///path.sock' -> Address; ListenError with one line otherwise."""
    if listen.startswith("unix://"):
        path = listen[len("unix://"):]
        if not path:
            raise ListenError(f"listen address {listen!r}: missing socket path (unix:///path.sock)")
        return Address("unix", path=path)
    if listen.startswith("tcp://"):
        rest = listen[len("tcp://"):]
        host, sep, port = rest.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ListenError(f"listen address {listen!r}: expected tcp://HOST:PORT")
        return Address("tcp", host=host, port=int(port))
    raise ListenError(f"listen address {listen!r}: expected tcp://HOST:PORT or unix:///path.sock")


class Metrics:
    """Counters and a latency histogram, rendered as Prometheus text."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.records_ok = 0
        self.records_error = 0
        self.connections = 0  # open now (a gauge)
        self.overloaded = 0
        self.warnings = 0
        self.reloads_ok = 0
        self.reloads_failed = 0
        self.streams_evicted = {"capacity": 0, "idle": 0}
        self.lat_counts = [0] * (len(_LAT_BUCKETS) + 1)
        self.lat_sum = 0.0
        self.lat_n = 0

    def request(self, path: str, code: int, seconds: float) -> None:
        key = (path, code)
        self.requests[key] = self.requests.get(key, 0) + 1
        i = 0
        while i < len(_LAT_BUCKETS) and seconds > _LAT_BUCKETS[i]:
            i += 1
        self.lat_counts[i] += 1
        self.lat_sum += seconds
        self.lat_n += 1


class SidecarState:
    """Everything behind the protocol, without the transport: testable and benchmarkable directly."""

    def __init__(self, db: str, config: SidecarConfig | None = None, matcher_config: MatcherConfig | None = None,
                 forecast: ForecastConfig | None = None, warnings_jsonl: str | None = None) -> None:
        self.db = os.fspath(db)
        self.cfg = config or SidecarConfig()
        self.matcher_config = matcher_config
        self.forecast = forecast
        self.matcher = Matcher.open(self.db, config=matcher_config)
        self._sig = _file_sig(self.db)
        # least recently seen first: eviction pops from the front, a record moves its stream to the end (O(1))
        self.streams: OrderedDict[tuple[str, str, str, str], _SidecarStream] = OrderedDict()
        self._next_sweep = 0.0
        self.warnings: deque[dict[str, Any]] = deque(maxlen=self.cfg.warnings_kept)
        self.seq = 0
        self.metrics = Metrics()
        self.started = time.time()
        self._jsonl = open(warnings_jsonl, "a", buffering=1, encoding="utf-8") if warnings_jsonl else None
        self._bucket = (self.cfg.max_records_per_s or 0.0, time.monotonic())

    # ------------------------------------------------------------------ records

    def observe_payload(self, payload: Any) -> list[dict[str, Any]]:
        """The answer list for a decoded JSON body (one record or a list of records)."""
        records = payload if isinstance(payload, list) else [payload]
        now = time.monotonic()  # one clock read per request: last-seen times need no finer grain than the TTL
        if now >= self._next_sweep:
            self.expire_idle(now)
        return [self.observe_record(r, now) for r in records]

    def observe_record(self, rec: Any, now: float | None = None) -> dict[str, Any]:
        try:
            return self._observe(rec, time.monotonic() if now is None else now)
        except (OptwinError, ValueError, TypeError, KeyError, OverflowError) as e:
            self.metrics.records_error += 1
            msg = first_line(e)
            return {"error": msg[:300]}

    def _observe(self, rec: Any, now: float) -> dict[str, Any]:
        if type(rec) is not dict:
            raise ValueError(f"record must be a JSON object, got {type(rec).__name__}")
        name, op, variant, dtype = rec.get("stream"), rec.get("op"), rec.get("variant"), rec.get("dtype")
        key = (name, op, variant, dtype)
        try:
            s = self.streams.get(key)  # hit: the names were checked when the stream was created
        except TypeError:  # a list or object among the names cannot be a key: _check_names says which field
            s = None
        if s is None:
            _check_names(key)
        # The whole record is checked before its stream is created or touched: a rejected record that created its
        # stream first evicted a valid stream at max_streams (erasing its history and warning state) and left junk
        # streams in the table and the optwin_sidecar_streams gauge.
        params = rec.get("params")
        if params is not None and type(params) is not dict:
            raise ValueError("record field 'params' must be a JSON object")
        t = rec.get("t")
        if t is None:
            # Required (shared/spec/api.md lists "t": seconds in the record and names no default). Stamping the
            # record with this server's monotonic clock, as before, gave it a clock unrelated to the producer's:
            # the forecaster read it as a second producer, and a drifting stream's warning came 31 calls late (or a
            # false one came at once).
            # Stream.observe may default t to now because there the producer's clock is the stream's.
            raise ValueError("record field 't' is missing: send the producer's time in seconds (time.monotonic())")
        if type(t) is not float and (type(t) is not int):
            raise ValueError("record field 't' must be a finite number of seconds")
        elif not -_INF < t < _INF:
            raise ValueError("record field 't' must be a finite number of seconds")
        try:
            t = float(t)
        except OverflowError:  # an int past double range (a 400-digit t): the same line as for inf
            raise ValueError("record field 't' must be a finite number of seconds") from None
        sk = fast_validate_sketch(op, rec.get("sketch"))
        if s is None:
            s = self._new_stream(key)
        else:
            self.streams.move_to_end(key)
        s.seen = now
        r = s.observe_valid(sk, t)
        self.metrics.records_ok += 1
        if r.raised:
            self._warn(s, r)
        return {"stream": name, "warn": r.warn, "probability": r.probability, "known": r.known, "eta_s": r.eta_s}

    def _new_stream(self, key: tuple) -> _SidecarStream:
        """A stream for a record already checked whole (_observe), evicting the least recently seen at the cap."""
        name, op, variant, dtype = key
        s = _SidecarStream(self.matcher, name, op, variant, dtype, config=self.forecast)  # CatalogError on bad names
        # only a valid record evicts: refusing new streams at the cap (as before) starved every new call site for
        # the life of the process while streams quiet for hours were kept
        while len(self.streams) >= max(1, self.cfg.max_streams):
            self.streams.popitem(last=False)
            self.metrics.streams_evicted["capacity"] += 1
        self.streams[key] = s
        return s

    def expire_idle(self, now: float | None = None) -> int:
        """Drop the streams not seen for stream_ttl_s (none without a TTL); the number dropped."""
        ttl = self.cfg.stream_ttl_s
        now = time.monotonic() if now is None else now
        self._next_sweep = now + 1.0
        if ttl is None:
            return 0
        cutoff, n = now - ttl, 0
        streams = self.streams
        while streams:
            key = next(iter(streams))
            if streams[key].seen > cutoff:  # the rest were seen later still
                break
            del streams[key]
            n += 1
        self.metrics.streams_evicted["idle"] += n
        return n

    def _warn(self, s: Stream, r: Any) -> None:
        self.seq += 1
        w = {"seq": self.seq, "stream": s.name, "op": s.op, "variant": s.variant, "dtype": s.dtype, "t": r.t,
             "time": time.time(), "reason": "risk" if r.max_probability >= self.matcher.config.threshold else "forecast",
             "probability": r.probability, "known": r.known, "eta_s": r.eta_s, "build_id": self.matcher.build_id}
        self.warnings.append(w)
        self.metrics.warnings += 1
        log.warning("stream %s (%s/%s/%s): %s, p=%s, eta_s=%s", s.name, s.op, s.variant, s.dtype, w["reason"],
                    r.probability, r.eta_s)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(w) + "\n")

    def warnings_since(self, since: int) -> list[dict[str, Any]]:
        return [w for w in self.warnings if w["seq"] > since]

    def take_tokens(self, n: int) -> bool:
        """Token bucket for max_records_per_s, a second's worth deep (always True without a cap). A batch larger
        than the bucket is taken when the bucket is full and leaves it in debt, so the rate still holds on average
        (a batch of 256, the client's, under a cap of 100 a second: one batch every 2.56 s), where refusing every
        batch larger than the bucket would refuse it for ever."""
        cap = self.cfg.max_records_per_s
        if not cap:
            return True
        tokens, last = self._bucket
        now = time.monotonic()
        tokens = min(cap, tokens + (now - last) * cap)
        if tokens < min(n, cap):
            self._bucket = (tokens, now)
            return False
        self._bucket = (tokens - n, now)
        return True

    # ------------------------------------------------------------------ reload

    def changed(self) -> bool:
        return _file_sig(self.db) != self._sig

    def load_new(self) -> Matcher | None:
        """Load the database file as it is now (worker thread). None (counted, logged) on failure."""
        sig = _file_sig(self.db)
        try:
            m = Matcher.open(self.db, config=self.matcher_config)
        except Exception as e:  # any failure keeps the old index serving
            self._sig = sig
            self.metrics.reloads_failed += 1
            log.error("reload of %s failed, still serving build %s: %s", self.db, self.matcher.build_id,
                      first_line(e))
            return None
        self._sig = sig
        return m

    def swap(self, m: Matcher) -> None:
        self.matcher = m
        for s in self.streams.values():
            s.rebind(m)
        self.metrics.reloads_ok += 1
        log.info("loaded build %s from %s", m.build_id, self.db)

    # ------------------------------------------------------------------ metrics

    def prometheus(self, lag_s: float) -> str:
        self.expire_idle()  # the gauge counts live streams also when no records arrive
        mt = self.metrics
        out = [
            "# HELP optwin_sidecar_records_total Records observed, by result.",
            "# TYPE optwin_sidecar_records_total counter",
            f'optwin_sidecar_records_total{{result="ok"}} {mt.records_ok}',
            f'optwin_sidecar_records_total{{result="error"}} {mt.records_error}',
            "# HELP optwin_sidecar_requests_total HTTP requests, by path and status code.",
            "# TYPE optwin_sidecar_requests_total counter",
        ]
        for (path, code), n in sorted(mt.requests.items()):
            out.append(f'optwin_sidecar_requests_total{{path="{path}",code="{code}"}} {n}')
        out += [
            "# HELP optwin_sidecar_overloaded_total Observe requests refused with 503 (overload).",
            "# TYPE optwin_sidecar_overloaded_total counter",
            f"optwin_sidecar_overloaded_total {mt.overloaded}",
            "# HELP optwin_sidecar_warnings_total Stream warning episodes raised.",
            "# TYPE optwin_sidecar_warnings_total counter",
            f"optwin_sidecar_warnings_total {mt.warnings}",
            "# HELP optwin_sidecar_reloads_total Database reloads, by result.",
            "# TYPE optwin_sidecar_reloads_total counter",
            f'optwin_sidecar_reloads_total{{result="ok"}} {mt.reloads_ok}',
            f'optwin_sidecar_reloads_total{{result="failed"}} {mt.reloads_failed}',
            "# HELP optwin_sidecar_streams Streams tracked.",
            "# TYPE optwin_sidecar_streams gauge",
            f"optwin_sidecar_streams {len(self.streams)}",
            "# HELP optwin_sidecar_streams_evicted_total Streams dropped: least recently seen at max_streams "
            "(capacity) or not seen for stream_ttl_s (idle).",
            "# TYPE optwin_sidecar_streams_evicted_total counter",
            f'optwin_sidecar_streams_evicted_total{{reason="capacity"}} {mt.streams_evicted["capacity"]}',
            f'optwin_sidecar_streams_evicted_total{{reason="idle"}} {mt.streams_evicted["idle"]}',
            "# HELP optwin_sidecar_connections Client connections open.",
            "# TYPE optwin_sidecar_connections gauge",
            f"optwin_sidecar_connections {mt.connections}",
            "# HELP optwin_sidecar_loop_lag_seconds Event-loop lag (smoothed).",
            "# TYPE optwin_sidecar_loop_lag_seconds gauge",
            f"optwin_sidecar_loop_lag_seconds {lag_s:.6f}",
            "# HELP optwin_sidecar_build_info The loaded fingerprint build.",
            "# TYPE optwin_sidecar_build_info gauge",
            f'optwin_sidecar_build_info{{build_id="{_label(self.matcher.build_id)}"}} 1',
            "# HELP optwin_sidecar_twin_version_mismatch 1 when some served fingerprints were replayed by another "
            "twin version than this optwin's (/healthz lists them).",
            "# TYPE optwin_sidecar_twin_version_mismatch gauge",
            f"optwin_sidecar_twin_version_mismatch {int(self.matcher.twin_version_mismatch)}",
            "# HELP optwin_sidecar_request_seconds Request handling time.",
            "# TYPE optwin_sidecar_request_seconds histogram",
        ]
        cum = 0
        for le, n in zip(_LAT_BUCKETS, mt.lat_counts):
            cum += n
            out.append(f'optwin_sidecar_request_seconds_bucket{{le="{le}"}} {cum}')
        out.append(f'optwin_sidecar_request_seconds_bucket{{le="+Inf"}} {mt.lat_n}')
        out.append(f"optwin_sidecar_request_seconds_sum {mt.lat_sum:.6f}")
        out.append(f"optwin_sidecar_request_seconds_count {mt.lat_n}")
        return "\n".join(out) + "\n"

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None


def _check_names(key: tuple) -> None:
    """ValueError (CatalogError for unknown names) naming the field unless a record's stream names can make a new
    stream."""
    name, op = key[0], key[1]
    for field, v in zip(("stream", "op", "variant", "dtype"), key):
        if not isinstance(v, str) or not v:
            raise ValueError(f"record field {field!r} must be a non-empty string")
    if len(name) > 512:
        raise ValueError("record field 'stream' is longer than 512 characters")
    # The matcher's own check (Matcher.triple_index), in its words, before the sketch is read: checking the op alone
    # let an unknown variant or dtype be answered with the sketch's missing features, the dtype never named.
    check_variant_dtype(op, key[2], key[3])


class _SidecarStream(Stream):
    """A Stream with the server's monotonic time of its last record (for stream_ttl_s)."""

    seen: float = 0.0


def _label(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def _file_sig(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _socket_id(st: os.stat_result) -> tuple[int, int, int]:
    """What tells one socket file from another at the same path: st_ino alone does not, as a filesystem (ext4, xfs)
    hands a freed inode number to the next file it makes; st_dev names the filesystem, st_mtime_ns the moment the
    file was made (or _own_socket's stamp)."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def _own_socket(path: str) -> tuple[int, int, int]:
    """The _socket_id of the socket file just bound at path. Its mtime is first set to the clock's nanoseconds: file
    timestamps may have the kernel's coarse tick (ms), which a file made in the same tick shares, the fine clock's
    value no other file is made with. A filesystem that refuses the stamp keeps its own time."""
    try:
        now = time.time_ns()
        os.utime(path, ns=(now, now), follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass
    return _socket_id(os.lstat(path))


def _bind_error(address: Address, e: OSError) -> str:
    """One line naming the address and what the OS refused."""
    if isinstance(e, socket.gaierror):  # a host that does not resolve: its errno is negative (EAI_*), not an OS errno
        reason = e.strerror or str(e)
    else:
        reason = os.strerror(e.errno) if e.errno else str(e)  # asyncio's own text repeats the address as a tuple
    if address.kind == "unix" and isinstance(e, FileNotFoundError):
        reason += f" (directory {os.path.dirname(os.path.abspath(address.path))} does not exist)"
    return f"cannot listen on {address}: {reason}"


def check_bind(address: Address) -> None:
    """Bind `address` and let it go again: ListenError with `_bind_error`'s one line if the OS refuses it (a busy
    port, an address of no interface here, a host that does not resolve, a unix socket's missing directory).

    For commands whose server starts after slow work (the sidecar's database load, Streamlit's start in a child):
    they call this first, so bad input fails at once in one line. A port taken between the check and the real bind
    still fails there. Port 0 checks only the host."""
    if address.kind == "unix":
        _clear_stale_socket(address.path)  # refuses a live server's socket or another file, as the real bind would
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(address.path)
            os.remove(address.path)
        except OSError as e:
            raise ListenError(_bind_error(address, e)) from None
        finally:
            s.close()
        return
    bound: list[socket.socket] = []
    try:
        # every address the host resolves to, as asyncio.start_server binds them
        infos = socket.getaddrinfo(address.host or None, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, sockaddr in dict.fromkeys(infos):
            s = socket.socket(family, kind, proto)
            bound.append(s)
            # as the servers bind: SO_REUSEADDR (a port in TIME_WAIT is free; a listening one is still refused on
            # Linux), and an IPv6 socket for IPv6 alone (the IPv4 address gets its own)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(sockaddr)
    except OSError as e:
        raise ListenError(_bind_error(address, e)) from None
    finally:
        for s in bound:
            s.close()


def check_listen(address: Address, token: str | None) -> None:
    """What `serve` refuses before it loads anything: an address off loopback without a token (it must not listen
    there), or one the OS will not bind (it cannot)."""
    if not address.loopback and not token:
        raise ListenError(f"refusing to listen on non-loopback address {address} without --token")
    check_bind(address)


def _clear_stale_socket(path: str) -> None:
    """Remove what a killed sidecar left at a unix address, and nothing else: another file there is refused (it
    would be lost), and so is a socket that something still answers on (a running sidecar would lose its address
    without knowing it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ListenError(f"{path} exists and is not a socket: refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.remove(path)  # nobody listens: a stale socket
        return
    except OSError as e:
        raise ListenError(f"{path}: cannot tell whether a server listens there ({e})") from None
    finally:
        probe.close()
    raise ListenError(f"{path}: another server is listening there (another sidecar?)")


# A field name (RFC 9110 5.1, 5.6.2: token) and what a field value must not hold (5.5); Content-Length's digits (8.6).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CTL = re.compile(r"[\r\n\x00]")
_DIGITS = re.compile(r"[0-9]+")


class _BadHead(ValueError):
    """A request head that must be refused with 400 and a close (the message is the answer's error)."""


class _BadFraming(Exception):
    """A request body whose chunked framing is broken: answered with `code` and this message, then closed."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


async def _line(reader: asyncio.StreamReader, most: int, what: str) -> bytes:
    """One CRLF-terminated line of a chunked body, CRLF included, of at most `most` bytes."""
    try:
        line = await reader.readuntil(b"\r\n")
    except asyncio.LimitOverrunError:  # no CRLF within the stream's limit (64 KiB)
        line = b""
    if not line or len(line) > most:
        raise _BadFraming(400, f"{what} longer than {most} bytes")
    return line


async def _body_pieces(reader: asyncio.StreamReader, length: int | None) -> AsyncIterator[bytes]:
    """A request body's data in pieces of at most _PIECE bytes, framed by Content-Length (length bytes) or, with
    length None, by the chunked coding (RFC 9112 7.1): chunk-size lines in hex whose extensions are ignored, the
    last chunk (size 0), then trailer fields, read and dropped up to the empty line that ends the body, so that a
    next request on the connection starts where it should. The one reader of bodies, kept or dropped: the caller
    decides how much it takes (max_body, max_discard). IncompleteReadError on EOF; _BadFraming on a broken chunked
    framing."""
    if length is not None:
        while length > 0:
            piece = await reader.readexactly(min(length, _PIECE))
            length -= len(piece)
            yield piece
        return
    while True:
        line = await _line(reader, _MAX_CHUNK_LINE, "chunk size line")
        m = _CHUNK_SIZE.fullmatch(line)
        if m is None:
            raise _BadFraming(400, f"malformed chunk size line {line[:40].decode('latin-1')!r}")
        size = int(m[1], 16)
        if not size:
            break
        while size > 0:
            piece = await reader.readexactly(min(size, _PIECE))
            size -= len(piece)
            yield piece
        if await reader.readexactly(2) != b"\r\n":
            raise _BadFraming(400, "chunk data longer than its chunk size")
    seen = 0  # the trailer section: nothing here uses trailer fields (7.1.2 lets a recipient drop them)
    while (line := await _line(reader, _MAX_TRAILERS, "chunked trailer field")) != b"\r\n":
        seen += len(line)
        if seen > _MAX_TRAILERS:
            raise _BadFraming(431, f"chunked trailer section longer than {_MAX_TRAILERS} bytes")


async def _read_body(pieces: AsyncIterator[bytes], most: int) -> bytes | None:
    """The whole body from _body_pieces, or None as soon as it is found longer than `most` bytes (the rest of it is
    left in `pieces`, for _discard)."""
    parts, n = [], 0
    async for piece in pieces:
        n += len(piece)
        if n > most:
            return None
        parts.append(piece)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class Sidecar:
    """The asyncio HTTP server around a SidecarState."""

    def __init__(self, state: SidecarState, address: Address, token: str | None = None) -> None:
        if not address.loopback and not token:
            raise ListenError(f"refusing to listen on non-loopback address {address} without --token")
        self.state = state
        self.address = address
        self._token = token.encode() if token else None
        self.lag_s = 0.0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task] = []
        self.ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # connection tasks -> whether a request is being served on them (its head has arrived): on shutdown idle
        # connections close at once and busy ones finish their request first (aclose)
        self._conns: dict[asyncio.Task, bool] = {}
        self._closing = False
        self._sock_id: tuple[int, int, int] | None = None  # the unix socket file this server bound (_socket_id)
        self._signal: str | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            if self.address.kind == "unix":
                _clear_stale_socket(self.address.path)
                # asyncio (3.13+) would remove the file on close when its st_ino alone matches: aclose does it instead
                kw = {"cleanup_socket": False} if sys.version_info >= (3, 13) else {}
                self._server = await asyncio.start_unix_server(self._client, path=self.address.path, limit=1 << 16,
                                                               **kw)
                self._sock_id = _own_socket(self.address.path)
            else:
                self._server = await asyncio.start_server(self._client, self.address.host, self.address.port,
                                                          limit=1 << 16, backlog=1024, reuse_address=True)
        except OSError as e:  # the OS's words alone ("[Errno 2] No such file or directory") name neither
            raise ListenError(_bind_error(self.address, e)) from None
        if self.address.kind == "tcp" and self.address.port == 0:  # ephemeral port: report the real one
            port = self._server.sockets[0].getsockname()[1]
            self.address = Address("tcp", host=self.address.host, port=port)
        self._tasks = [asyncio.create_task(self._lag_monitor()), asyncio.create_task(self._reloader())]
        self.ready.set()
        log.info("optwin sidecar serving build %s on %s", self.state.matcher.build_id, self.address)

    async def serve_forever(self) -> None:
        await self.start()
        assert self._stop is not None
        if self._signal is not None:  # came while start() was binding
            self._stop.set()
        await self._stop.wait()
        await self.aclose()
        if self._signal is not None:
            log.info("optwin sidecar stopped on %s", self._signal)

    def on_signal(self, sig: signal.Signals) -> None:
        """A stop signal's handler (loop.add_signal_handler): stop as stop() does, and say which signal it was."""
        self._signal = sig.name
        if self._stop is not None:
            self._stop.set()

    async def aclose(self) -> None:
        """Stop accepting, close idle connections, let requests in flight finish (for up to request_timeout_s, at
        most 5 s) and answer with Connection: close. The unix socket file this server bound is removed first, while it
        still listens (and only if the file at the path is still that one): a new sidecar may take the address while
        this one drains."""
        self._closing = True
        for t in self._tasks:
            t.cancel()
        if self._sock_id is not None:
            # Before the listener closes: while it is open it holds the file's inode, so no other file can have the
            # same (st_dev, st_ino) yet. Once it closes (and the file is gone) the number is free for the next file
            # made there, a restarted sidecar's socket included: removing the file after the drain below, by st_ino
            # alone, used to remove that sidecar's socket.
            try:
                if _socket_id(os.lstat(self.address.path)) == self._sock_id:
                    os.unlink(self.address.path)
            except OSError:
                pass
            self._sock_id = None
        if self._server is not None:
            self._server.close()
        busy = []
        for task, serving in list(self._conns.items()):
            if serving:
                busy.append(task)
            else:
                task.cancel()  # waiting for a next request that will not be served
        if busy:
            _, late = await asyncio.wait(busy, timeout=min(self.state.cfg.request_timeout_s, 5.0))
            for task in late:
                task.cancel()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except (asyncio.TimeoutError, Exception):
                pass
        self.state.close()

    def stop(self) -> None:
        """Thread-safe stop."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    # ------------------------------------------------------------------ background tasks

    async def _lag_monitor(self, period: float = 0.01) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(period)
            lag = max(0.0, loop.time() - t0 - period)
            # smoothed both ways: one preemption of the process is not overload, a backlog is
            self.lag_s += (0.3 if lag > self.lag_s else 0.1) * (lag - self.lag_s)

    async def _reloader(self) -> None:
        while True:
            await asyncio.sleep(self.state.cfg.reload_poll_s)
            if self.state.changed():
                m = await asyncio.to_thread(self.state.load_new)
                if m is not None:
                    self.state.swap(m)

    # ------------------------------------------------------------------ HTTP

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.state.metrics.connections += 1
        task = asyncio.current_task()
        try:
            while not self._closing:
                self._conns[task] = False
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.state.cfg.request_timeout_s)
                except (asyncio.IncompleteReadError, asyncio.TimeoutError):
                    return
                except asyncio.LimitOverrunError:
                    await self._send(writer, 431, b'{"error": "request head too large"}', close=True)
                    self.state.metrics.request("other", 431, 0.0)
                    return
                self._conns[task] = True
                t0 = time.perf_counter()
                try:
                    keep = await self._request(head, reader, writer, t0)
                except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                    raise
                except Exception as e:  # a bug must cost one request, not the server
                    log.exception("request failed")
                    msg = json.dumps({"error": f"internal error: {type(e).__name__}"}).encode()
                    await self._send(writer, 500, msg, close=True)
                    self.state.metrics.request("other", 500, time.perf_counter() - t0)
                    return
                if not keep:
                    return
        except (ConnectionError, asyncio.CancelledError, asyncio.IncompleteReadError):
            return
        finally:
            self._conns.pop(task, None)
            await self._close(writer)
            self.state.metrics.connections -= 1

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        """Close, flushing answers still buffered for at most request_timeout_s: close() alone waits for the peer
        to read them, for ever if it never reads."""
        transport = writer.transport
        try:
            writer.close()
            if transport.get_write_buffer_size():
                await asyncio.wait_for(writer.wait_closed(), self.state.cfg.request_timeout_s)
        except asyncio.CancelledError:
            transport.abort()
            raise
        except Exception:  # timed out, or the peer is gone
            transport.abort()

    async def _request(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       t0: float) -> bool:
        st = self.state
        try:
            lines = head[:-4].decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
            headers = {}
            for ln in lines[1:]:
                k, sep, v = ln.partition(":")
                # Strict field lines (RFC 9112 5): a name that is a token right before the colon, values without
                # CR, LF or NUL, no obs-fold continuation line (5.2). Each was taken before by a lenient reading
                # ("Content-Length : 5", a folded " Transfer-Encoding: chunked" line) that another parser in
                # front may read differently, which is how a body's end comes to be disputed (request smuggling).
                if ln[:1] in (" ", "\t"):
                    raise _BadHead("obsolete line folding in request head")
                if not sep or not _TOKEN.fullmatch(k):
                    raise _BadHead(f"malformed header line {ln[:60]!r}")
                if _CTL.search(v):
                    raise _BadHead(f"header {k[:60]!r}: CR, LF or NUL in its value")
                k, v = k.lower(), v.strip(" \t")  # OWS is spaces and tabs only
                if k == "transfer-encoding" and k in headers:  # a list split over lines is one list (RFC 9110 5.3)
                    v = headers[k] + "," + v
                if k == "content-length":
                    # digits only (RFC 9110 8.6): int() also takes "+5", "1_0" and non-ASCII digits
                    if not all(_DIGITS.fullmatch(x.strip(" \t")) for x in v.split(",")):
                        raise _BadHead("bad Content-Length")
                    # Repeated (over lines, or as a list) with one value it may be folded to it; with different
                    # values the body's end is unknown, a 400 and a close (RFC 9112 6.3 item 5). Keeping the last
                    # one, as before, read a body another parser in front may have framed differently.
                    vals = {x.strip() for x in v.split(",")} | ({headers[k]} if k in headers else set())
                    v = vals.pop() if len(vals) == 1 else ",".join(sorted(vals))
                headers[k] = v
        except _BadHead as e:
            return await self._reply(writer, "other", 400, json.dumps({"error": str(e)}).encode(), False, t0)
        except ValueError:
            return await self._reply(writer, "other", 400, b'{"error": "malformed request line"}', False, t0)
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        path, _, query = target.partition("?")
        # The body's framing (RFC 9112 6.3): length is its size, or None for a chunked body, whose size is known
        # only once it has arrived (so max_body is enforced while it is read).
        length: int | None
        te = headers.get("transfer-encoding")
        if te is not None:
            codings = [c.strip().lower() for c in te.split(",") if c.strip()]
            if version != "HTTP/1.1":  # an HTTP/1.0 message with Transfer-Encoding has faulty framing (6.1)
                return await self._reply(writer, path, 400, b'{"error": "Transfer-Encoding needs HTTP/1.1"}', False,
                                         t0)
            if codings[-1:] != ["chunked"] or "chunked" in codings[:-1]:
                # chunked not last (or twice): the body's end cannot be found, a 400 and a close are a MUST (6.3)
                msg = json.dumps({"error": f"Transfer-Encoding {te[:100]!r}: chunked must be the final coding"})
                return await self._reply(writer, path, 400, msg.encode(), False, t0)
            if len(codings) > 1:  # e.g. "gzip, chunked": a coding this server does not decode, 501 (6.1)
                msg = json.dumps({"error": f"Transfer-Encoding {te[:100]!r} not implemented: send chunked alone"})
                return await self._reply(writer, path, 501, msg.encode(), False, t0)
            length = None
            if "content-length" in headers:
                # Both headers: Transfer-Encoding overrides Content-Length and the server MUST close the connection
                # after answering (6.3 item 3, 6.1); rejecting with 400 is allowed too. The body is read as chunked,
                # which reads all of it, so the answer is not lost to a reset of unread input; the close is what
                # defeats smuggling: whatever length a proxy in front took from Content-Length, no byte after the
                # chunked body is read as a next request.
                keep = False
        else:
            if "," in headers.get("content-length", ""):
                return await self._reply(writer, path, 400, b'{"error": "conflicting Content-Length values"}', False,
                                         t0)
            try:
                length = int(headers.get("content-length", "0"))
                if length < 0:
                    raise ValueError
            except ValueError:
                return await self._reply(writer, path, 400, b'{"error": "bad Content-Length"}', False, t0)
        has_body = length != 0
        # "Expect: 100-continue" (curl sends it for bodies over 1 MB): the client holds the body back until told to
        # send it, or until its own timeout (curl's: 1 s) when nobody answers. A refusal is answered at once and the
        # connection closed (RFC 9110 10.1.1): the body was never sent, so there is nothing to drain.
        expect = has_body and version == "HTTP/1.1" and headers.get("expect", "").lower() == "100-continue"
        if length is not None and length > st.cfg.max_body:
            await self._reply(writer, path, 413, b'{"error": "body too large"}', False, t0)
            if not expect:
                await self._discard(writer, _body_pieces(reader, length), st.cfg.max_discard)
            return False
        if self._token is not None:
            scheme, _, cred = headers.get("authorization", "").partition(" ")
            # the scheme name is case-insensitive (RFC 7235); the token is compared in constant time
            if scheme.lower() != "bearer" or not hmac.compare_digest(cred.strip().encode("latin-1"), self._token):
                # refused before the body is read: an unauthenticated client must not make the server buffer up to
                # max_body; a body it still sends is dropped as for a 413, then the connection closes
                await self._reply(writer, path, 401, b'{"error": "missing or wrong bearer token"}',
                                  keep and not has_body, t0)
                if not has_body:
                    return keep
                if not expect:
                    await self._discard(writer, _body_pieces(reader, length), st.cfg.max_discard)
                return False
        if expect:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = b""
        if has_body:
            pieces = _body_pieces(reader, length)
            try:
                # one deadline for the whole body, however it is framed: a client that trickles chunks gets no more
                # time than one that trickles a Content-Length body
                body = await asyncio.wait_for(_read_body(pieces, st.cfg.max_body), st.cfg.request_timeout_s)
            except asyncio.TimeoutError:
                return False
            except _BadFraming as e:  # where this body ends is unknown now: answered, then closed
                return await self._reply(writer, path, e.code, json.dumps({"error": str(e)}).encode(), False, t0)
            if body is None:  # a chunked body over max_body: found out while it arrives, the rest is still coming
                await self._reply(writer, path, 413, b'{"error": "body too large"}', False, t0)
                await self._discard(writer, pieces, st.cfg.max_discard - st.cfg.max_body)
                return False
        if path == "/v1/observe":
            if method != "POST":
                return await self._reply(writer, path, 405, b'{"error": "method not allowed: use POST"}', keep, t0,
                                         extra=b"Allow: POST\r\n")
            if self.lag_s > st.cfg.max_lag_s:
                st.metrics.overloaded += 1
                return await self._reply(writer, path, 503, b'{"error": "overloaded, retry later"}', keep, t0)
            try:
                payload = _loads(body)
            except (ValueError, RecursionError) as e:
                msg = json.dumps({"error": f"body is not JSON: {str(e)[:200]}"}).encode()
                return await self._reply(writer, path, 400, msg, keep, t0)
            n = len(payload) if isinstance(payload, list) else 1
            if n > st.cfg.max_records:
                return await self._reply(writer, path, 413, b'{"error": "too many records in one request"}', keep, t0)
            if not st.take_tokens(n):
                st.metrics.overloaded += 1
                return await self._reply(writer, path, 503, b'{"error": "over the record rate, retry later"}', keep, t0)
            out = _dumps(st.observe_payload(payload))
            return await self._reply(writer, path, 200, out, keep, t0)
        if method != "GET":
            if path in ("/v1/warnings", "/metrics", "/healthz"):
                return await self._reply(writer, path, 405, b'{"error": "method not allowed: use GET"}', keep, t0,
                                         extra=b"Allow: GET\r\n")
            return await self._reply(writer, path, 404, b'{"error": "not found"}', keep, t0)
        if path == "/v1/warnings":
            try:
                since = int(parse_qs(query).get("since", ["0"])[0])
            except ValueError:
                return await self._reply(writer, path, 400, b'{"error": "since must be an integer"}', keep, t0)
            return await self._reply(writer, path, 200, json.dumps(st.warnings_since(since)).encode(), keep, t0)
        if path == "/metrics":
            return await self._reply(writer, path, 200, st.prometheus(self.lag_s).encode(), keep, t0,
                                     ctype=b"text/plain; version=0.0.4")
        if path == "/healthz":
            m = st.matcher  # twin versions: fingerprints of older twins are served, and said so here
            msg = json.dumps({"status": "ok", "build_id": m.build_id, "db": st.db, "twin_versions": m.twin_versions,
                              "twin_version_mismatch": m.twin_version_mismatch}).encode()
            return await self._reply(writer, path, 200, msg, keep, t0)
        return await self._reply(writer, "other", 404, b'{"error": "not found"}', keep, t0)

    async def _discard(self, writer: asyncio.StreamWriter, pieces: AsyncIterator[bytes], most: int) -> None:
        """Read and drop (the rest of) a refused body, bounded in bytes (`most`, give or take a piece) and time
        (request_timeout_s): nginx's lingering close, so the answer already written is not lost to a reset."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.state.cfg.request_timeout_s

        async def drop() -> None:
            left = most
            while left > 0:
                piece = await anext(pieces, b"")
                if not piece:
                    return
                left -= len(piece)

        try:
            await asyncio.wait_for(writer.drain(), self.state.cfg.request_timeout_s)
            await asyncio.wait_for(drop(), max(0.0, deadline - loop.time()))
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, _BadFraming):
            return  # the connection closes either way

    async def _reply(self, writer: asyncio.StreamWriter, path: str, code: int, body: bytes, keep: bool, t0: float,
                     ctype: bytes = b"application/json", extra: bytes = b"") -> bool:
        keep = keep and not self._closing  # shutting down: this answer is the connection's last
        await self._send(writer, code, body, close=not keep, ctype=ctype, extra=extra)
        self.state.metrics.request(path if path in ("/v1/observe", "/v1/warnings", "/metrics", "/healthz") else "other",
                                   code, time.perf_counter() - t0)
        return keep

    async def _send(self, writer: asyncio.StreamWriter, code: int, body: bytes, close: bool = False,
                    ctype: bytes = b"application/json", extra: bytes = b"") -> None:
        head = (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n"
                % (code, _REASONS.get(code, "Error").encode(), ctype, len(body), extra,
                   b"Connection: close\r\n" if close else b""))
        writer.write(head + body)
        if writer.transport.get_write_buffer_size() > 1 << 20:
            # a slow reader: wait instead of buffering without bound, but not for ever: a client that sends requests
            # and never reads the answers would hold its connection and ~1 MB of buffer until the process ends
            try:
                await asyncio.wait_for(writer.drain(), self.state.cfg.request_timeout_s)
            except asyncio.TimeoutError:
                writer.transport.abort()
                raise ConnectionAbortedError("the client did not read its answers within request_timeout_s") from None


def serve(db: str, listen: str = "tcp://127.0.0.1:8765", token: str | None = None,
          warnings_jsonl: str | None = None, config: SidecarConfig | None = None, *, checked: bool = False) -> None:
    """Run the sidecar until interrupted (the `optwin serve` command). checked: the caller has just run
    check_listen itself (`optwin serve`, before its database checks), so the unix socket is not cleared, bound and
    removed a second time."""
    address = parse_listen(listen)
    if not checked:
        check_listen(address, token)  # before the database loads, which can take a while
    state = SidecarState(db, config=config, warnings_jsonl=warnings_jsonl)
    sidecar = Sidecar(state, address, token=token)
    try:
        asyncio.run(_serve_until_signalled(sidecar))
    except KeyboardInterrupt:  # Ctrl-C while the database loads, before the handlers are in place
        pass


async def _serve_until_signalled(sidecar: Sidecar) -> None:
    """serve_forever, stopped by SIGTERM or SIGINT: a service manager's stop (systemd, docker and kubernetes send
    SIGTERM) ends in aclose like Ctrl-C, where it killed the process, cutting answers in flight and leaving the
    unix socket file behind. The main thread only: SidecarThread's loops cannot take signals."""
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGTERM, signal.SIGINT)
    for sig in sigs:
        loop.add_signal_handler(sig, sidecar.on_signal, sig)
    try:
        await sidecar.serve_forever()
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)


class SidecarThread:
    """A sidecar on a background thread with its own event loop (tests, benchmarks, notebooks)."""

    def __init__(self, db: str, listen: str = "tcp://127.0.0.1:0", token: str | None = None,
                 warnings_jsonl: str | None = None, config: SidecarConfig | None = None,
                 forecast: ForecastConfig | None = None) -> None:
        self.state = SidecarState(db, config=config, warnings_jsonl=warnings_jsonl, forecast=forecast)
        self.sidecar = Sidecar(self.state, parse_listen(listen), token=token)
        self._thread = threading.Thread(target=self._run, name="optwin-sidecar", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self.sidecar.serve_forever())
        except BaseException as e:  # surfaced by start()
            self._error = e
            self.sidecar.ready.set()

    def start(self) -> "SidecarThread":
        self._thread.start()
        self.sidecar.ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    @property
    def url(self) -> str:
        return str(self.sidecar.address)

    def stop(self) -> None:
        self.sidecar.stop()
        # aclose lets requests in flight finish (up to min(request_timeout_s, 5) s), then waits on the server's
        # close (1 s) and closes the state: a shorter join returned with the database still open
        self._thread.join(min(self.sidecar.state.cfg.request_timeout_s, 5.0) + 5.0)

    def __enter__(self) -> "SidecarThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
