"""Deferred finishing of a row launch's sketch: the rows store their records, and one batched finisher launch
reduces the records of up to PAGE_CALLS calls later, off each call's own kernel.

    y, buf = softmax(x, defer=True)              # buf is pending: its features are not written yet
    read_sketch("softmax", buf, x.shape)         # settles buf's page first (one finisher launch)
    settle_all()                                 # or: every pending page now (a monitor's flush does this)

Deferring launches: softmax's row launch (softmax_rows) and layernorm's Welford launch (layernorm_welford, whose
launch keeps one extra program for the parameters' partials).
Why: a launch with a program per row (softmax's ROWS) runs one more program, the finisher, which polls the
rows' records while they run and reduces them. On the H200 that program costs the launch about 4 µs of 74
at 4096x16384 bf16 (stop 37's timeline: ~2 µs its presence beside the rows, ~2 µs its tail after the last
row), more than everything the rows themselves do for the sketch (~1.6 µs). Deferred, a call runs its rows
alone (no finisher program: the kernel's FINISHER_FIRST=False launch with grid = rows), and the finisher's
work for a page of calls runs as one launch of PAGE_CALLS programs, a call each, in parallel (Transformer
Engine's amax history is the same trade: per-step records, one reduction later).

A page belongs to one (op, device, stream), as the workspace and row records do (sketch_buffer), and is
settled on that stream, so stream order makes every record written before the finisher reads it. It holds,
per call slot: rows_cap rows of records (left at the sentinel by the finisher), its own workspace (flagged
rows' atomics; back at the identities after the finisher) and its row of the batch's features (the call's
buffer). The calls' (record offset, rows, columns) go to the device with the settle, in one pinned copy.

A page settles when its slots are full (PAGE_CALLS; fewer where MAX_PAGE_WORDS would be passed), before a
call with more rows than its slots hold (which gets a new page), when a pending buffer is read
(sketch_buffer.reduce_sketch), on settle_all(), and on settle_stale() once its batch is MAX_AGE_S old.
Waiters registered with when_settled run right after the finisher is queued (the monitor queues its
device-to-host copy there). Launches inside CUDA graph
capture never defer (a replay runs no host code: nothing would settle it), nor launches past MAX_ROWS rows
(whose serial finish would cost more than the in-launch finisher's overlapped one); the launchers ask takes().
Settled batches' feature blocks are reused once no caller holds a buffer of them (RETIRED_BLOCKS). Pages change
under one lock, which a launcher holds from a call's reservation until its launch is queued (`lock`), so a settle
from another thread waits for that launch.
Pure torch: the finishers are registered by the kernel modules (register_finisher).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from optwin.errors import InputError
from optwin.kernels.sketch_buffer import (
    SENTINEL,
    _capacity,
    _identity_slots,
    _stream_key,
    feature_names,
    fresh_workspaces,
)

# Calls a page holds before it settles: the settle's host time (its finisher launch and the page's bookkeeping)
# is paid once per this many. On one H200 host, in one process, 4096x16384 bf16 ran 88.0 µs a call (median of
# rounds, L2 flushed) at 16 against 76.8 at 64, host-bound (bench/results/deferred_finish_p16|p64_h200_s38.md).
# A monitor hears of a deferred call when its page settles: at most this many calls of the op on the stream late
PAGE_CALLS = 64
MIN_PAGE_ROWS = 1 << 12  # rows of records a page keeps per call at least
MAX_PAGE_WORDS = 1 << 22  # record words a page holds at most (32 MB): fewer calls a page for the longest launches
# Rows of a launch that defers at most. A settle's finisher reduces each call's records in one program, POLL
# (512) rows at a time in row order, after the calls ran; the in-launch finisher does the same polls while the
# rows run, and costs a call ~4 µs (stop 37). A settle's GPU time on the H200 (bench/deferred_finish.py --settle,
# bf16 rows of 8192; bench/results/deferred_settle_h200_s39.md): 4096 rows x 64 calls 24.4 µs (0.38 a call),
# 32768 x 64 94.0 (1.47 a call), 131072 x 16 (MAX_PAGE_WORDS) 309 (19.3 a call): ~1.2-1.4 µs a poll, serial in
# a call's program. 65536 rows (32 calls a page) would take ~155 µs, ~4.8 µs a call: more than the in-launch
# finisher, so the cap stays at 32768.
MAX_ROWS = 1 << 15

# Seconds a batch may wait for its page to fill before settle_stale() settles it (a monitor calls it on each
# call it sees): an op called rarely would otherwise hold its sketches back for 64 of its calls
MAX_AGE_S = 0.05

# Pinned descriptor buffers a page cycles through: a settle writes one while the copies out of the others may
# still be queued (a host that runs pages ahead of the GPU), so a settle waits for the GPU only when the host
# is DESC_RING settles ahead of it (the first form waited for the settle before's copy every time)
DESC_RING = 8

# Settled batches' feature blocks a page keeps for reuse: a later batch takes one that no caller holds (no
# reference to any of its buffers, nor any tensor made from them), where a fresh block costs its unbind into
# per-call buffers, ~120 µs of host time at 64 calls, all at once at the settle (a CPU; bench/deferred_finish.py
# --trace: the GPU idled 0.6-0.9 ms around each settle of calls back to back on the H200, torch.profiler on)
RETIRED_BLOCKS = 4

# op -> finish(page, features, desc, calls): launches the op's batched finisher over a settling batch of `calls`
# calls, whose buffers are the first rows of features (float64 (calls_cap, features)) and whose (record word
# offset, rows, columns) are desc's first rows (int64 (calls_cap, 3) on the device)
_FINISHERS: dict[str, Callable[["Page", torch.Tensor, torch.Tensor, int], None]] = {}


def _storage_uses(t: torch.Tensor) -> int:
    """How many tensors share t's storage (-1 where this torch cannot say: then no block is reused)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return count(t.untyped_storage()._cdata) if count is not None else -1


def _most_refs(views: list[torch.Tensor]) -> int:
    """The most Python references any of a block's buffers has (this function's own counted alike each time)."""
    return max(sys.getrefcount(v) for v in views)


@dataclass(eq=False)  # identity: a block holds tensors, and retired blocks are found and removed by identity
class Block:
    """A batch's features (float64 (calls_cap, features)) and its per-call buffers (the rows, made once), with
    the storage's use count and the buffers' reference count while only the page holds them."""

    features: torch.Tensor
    views: list[torch.Tensor]
    uses: int
    refs: int

    @classmethod
    def fresh(cls, op: str, calls: int, device: torch.device) -> "Block":
        features = torch.empty((calls, len(feature_names(op))), dtype=torch.float64, device=device)
        views = list(features.unbind(0))
        return cls(features, views, _storage_uses(features), _most_refs(views))

    def unheld(self) -> bool:
        """No caller holds a buffer of this block, nor a tensor made from one: a new batch may write it."""
        return self.uses >= 0 and _storage_uses(self.features) == self.uses and _most_refs(self.views) <= self.refs


@dataclass
class Page:
    """One (op, device, stream)'s pending calls and the device memory they write: each call a slot of
    rows_cap rows' records, its own workspace row and its row of the batch's features. Every per-slot view
    is made once (a view costs microseconds of host time, which a sketched launch cannot spare)."""

    op: str
    device: torch.device
    stream: int  # the raw CUDA stream handle (0 on the CPU)
    words: int  # record words per row
    rows_cap: int  # rows a call may have on this page
    records: torch.Tensor  # int64 (calls_cap, rows_cap * words), SENTINEL where no pending call wrote
    ws_f: torch.Tensor  # float64 (calls_cap, 2 * SLOTS): each call's workspace float slots and identities
    ws_i: torch.Tensor  # int64 (calls_cap, SLOTS)
    desc_host: torch.Tensor  # int64 (DESC_RING, calls_cap, 3), pinned on CUDA: settles' (offset, rows, columns)
    desc: torch.Tensor  # int64 (calls_cap, 3): what the finisher reads, on the device
    slots: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per slot views
    block: Block | None = None  # this batch's features and buffers
    retired: list[Block] = field(default_factory=list)  # settled batches' blocks, oldest first (RETIRED_BLOCKS)
    calls: list[tuple[int, int, int]] = field(default_factory=list)  # (record word offset, rows, columns)
    opened: float = 0.0  # time.monotonic() of this batch's first call
    waiters: list[Callable[[], None]] = field(default_factory=list)
    settles: int = 0  # settles so far: the next one writes desc_host[settles % DESC_RING]
    copied: list[torch.cuda.Event | None] = field(default_factory=lambda: [None] * DESC_RING)  # each copy's

    @property
    def calls_cap(self) -> int:
        return self.records.shape[0]


# Held while pages change (reserve, settles, waiters) and by a launcher from its reservation until its launch is
# queued: a settle from another thread (a monitor flushed from a reporting thread) must not queue a page's
# finisher between a call's reservation and its launch, where the finisher would wait on the GPU for records that
# the rows, queued behind it on the same stream, never write first. Reentrant: a settle's waiters may launch.
lock = threading.RLock()
_NO_LOCK = contextlib.nullcontext()


def launch_lock(defer: bool) -> contextlib.AbstractContextManager:
    """`lock` for a launcher whose call defers (from its reservation until its launch is queued), else nothing."""
    return lock if defer else _NO_LOCK

_PAGES: dict[tuple[str, str, int], Page] = {}
# id of a filling batch's features -> (the features, its page): a call's buffer is a view of them (one entry a
# batch, not a call: a settle then drops one entry, not 64 found by address)
_PENDING: dict[int, tuple[torch.Tensor, Page]] = {}


def register_finisher(op: str, finish: Callable[[Page, torch.Tensor, torch.Tensor, int], None]) -> None:
    """`finish(page, features, desc, calls)`: launch op's finisher over a settling batch (see _FINISHERS)."""
    _FINISHERS[op] = finish


def takes(n_rows: int, device: torch.device) -> bool:
    """Whether a row launch of n_rows on device's current stream may defer: some rows, at most MAX_ROWS, and
    no CUDA graph capture (a replay runs no host code: nothing would settle it)."""
    return 0 < n_rows <= MAX_ROWS and not (device.type == "cuda" and torch._C._cuda_isCurrentStreamCapturing())


def _new_page(op: str, key: tuple[str, str, int], words: int, n_rows: int) -> Page:
    device = torch.device(key[1])  # with its index: the page's stream is that device's
    rows_cap = _capacity(max(n_rows, MIN_PAGE_ROWS))
    calls_cap = max(1, min(PAGE_CALLS, MAX_PAGE_WORDS // (rows_cap * words)))
    ws_f, ws_i = fresh_workspaces(op, device, (calls_cap,))
    records = torch.full((calls_cap, rows_cap * words), SENTINEL, dtype=torch.int64, device=device)
    cuda = device.type == "cuda"
    desc_host = torch.zeros((DESC_RING, calls_cap, 3), dtype=torch.int64, pin_memory=cuda)
    page = Page(op, device, key[2], words, rows_cap, records, ws_f, ws_i, desc_host,
                desc_host[0].to(device) if cuda else desc_host[0].clone())
    page.slots = list(zip(records.unbind(0), ws_f.unbind(0), ws_i.unbind(0)))
    return page


def reserve(op: str, device: torch.device, n_rows: int, n_cols: int,
            words: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pending call's (buffer, records, workspace float slots, int slots) on the current stream's page: the
    row launch writes the records and workspace; the buffer is final once its page settles. The caller holds
    `lock` until the launch that writes them is queued."""
    with lock:
        key = _stream_key(op, device)
        page = _PAGES.get(key)
        if page is not None and len(page.calls) == page.calls_cap:
            _settle(page)
        if page is None or n_rows > page.rows_cap or page.words != words:
            if op not in _FINISHERS:
                raise InputError(f"{op}: no deferred finisher; expected one of {', '.join(sorted(_FINISHERS)) or 'none'}")
            if page is not None:
                _settle(page)  # its memory is freed in stream order, after its finisher
            page = _PAGES[key] = _new_page(op, key, words, n_rows)
        if page.block is None:  # a batch's buffers: a settled block no caller holds any more, else a fresh one
            page.block = next((b for b in page.retired if b.unheld()), None)
            if page.block is not None:
                page.retired.remove(page.block)
            else:
                page.block = Block.fresh(op, page.calls_cap, page.device)
            _PENDING[id(page.block.features)] = (page.block.features, page)
        k = len(page.calls)
        if k == 0:
            page.opened = time.monotonic()
        page.calls.append((k * page.rows_cap * words, n_rows, n_cols))
        buf = page.block.views[k]
        records, ws_f, ws_i = page.slots[k]
        return buf, records, ws_f, ws_i


def _page_of(buf: torch.Tensor) -> Page | None:
    """The page whose unsettled batch buf belongs to, or None."""
    base = buf._base
    entry = _PENDING.get(id(base)) if base is not None else None
    return entry[1] if entry is not None and entry[0] is base else None


def pending(buf: torch.Tensor) -> bool:
    """Whether buf is a deferred call's buffer whose page has not settled yet."""
    return _page_of(buf) is not None


def when_settled(buf: torch.Tensor, fn: Callable[[], None]) -> None:
    """Run fn() once buf's finisher is queued (at once if buf is not pending)."""
    with lock:
        page = _page_of(buf)
        if page is not None:
            page.waiters.append(fn)
            return
    fn()


def settle(buf: torch.Tensor) -> None:
    """Queue the finisher of buf's page, if buf is pending (no host sync)."""
    with lock:
        page = _page_of(buf)
        if page is not None:
            _settle(page)


def settle_stale(max_age_s: float | None = None) -> None:
    """Queue the finisher of every page whose batch opened more than max_age_s (default MAX_AGE_S) ago."""
    if not _PAGES:
        return
    oldest = time.monotonic() - (MAX_AGE_S if max_age_s is None else max_age_s)
    with lock:
        for page in list(_PAGES.values()):
            if page.calls and page.opened <= oldest:
                _settle(page)


def settle_all() -> None:
    """Queue the finisher of every page with pending calls."""
    with lock:
        for page in list(_PAGES.values()):
            _settle(page)


@contextlib.contextmanager
def _on_stream(page: Page) -> Iterator[None]:
    """The page's stream made current (launches and copies go where its calls went)."""
    if page.device.type != "cuda":
        yield
        return
    idx = page.device.index
    if torch.cuda.current_device() == idx and torch._C._cuda_getCurrentRawStream(idx) == page.stream:  # no switch
        yield
        return
    with torch.cuda.device(page.device), \
            torch.cuda.stream(torch.cuda.ExternalStream(page.stream, device=page.device)):
        yield


def _settle(page: Page) -> None:
    if not page.calls:
        return
    calls, waiters, block = page.calls, page.waiters, page.block
    page.calls, page.waiters, page.block = [], [], None
    features = block.features
    _PENDING.pop(id(features), None)
    page.retired = (page.retired + [block])[-RETIRED_BLOCKS:] if RETIRED_BLOCKS > 0 else []
    n = len(calls)
    r = page.settles % DESC_RING
    page.settles += 1
    with _on_stream(page):
        done = page.copied[r]
        if done is not None and not done.query():
            done.synchronize()  # DESC_RING settles ahead of the GPU: wait for this buffer's last copy
        page.desc_host[r].numpy()[:n] = calls
        if page.device.type == "cuda":
            page.desc.copy_(page.desc_host[r], non_blocking=True)
            if done is None:
                done = page.copied[r] = torch.cuda.Event()
            done.record()
        else:
            page.desc.copy_(page.desc_host[r])
        _FINISHERS[page.op](page, features, page.desc, n)
        for fn in waiters:
            fn()


def leftover() -> tuple[int, int]:
    """(record words off the sentinel, workspace slots off their identities) over every page: 0 once settled
    (and the finishers ran). One device sync."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    words = slots = 0
    for page in _PAGES.values():
        words += int((page.records != SENTINEL).sum())
        slots += int((page.ws_f != _identity_slots(page.op, page.device)).sum()) + int((page.ws_i != 0).sum())
    return words, slots
