"""softmax's deferred finishing (optwin.kernels.deferred) under TRITON_INTERPRET=1: a row launch without its
finisher program, the records of a page of calls reduced by one batched finisher launch later. Its features
are bit for bit the in-launch finisher's (the same code over the same records, in the same order); pages
settle when read, when full and on settle_all; every record word and workspace slot is back at rest after.

    python -m pytest -q tests/test_kernels_softmax_deferred.py
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest
import torch
from _kernel_checks import bits, seed

from optwin.errors import InputError
from optwin.kernels import deferred, read_sketch
from optwin.kernels._common import RECORD_POLL
from optwin.kernels.sketch_buffer import new_buffer
from optwin.kernels.softmax import _softmax_launch, softmax


def _in_launch(x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """(y, sketch) of the row launch with its own finisher program."""
    y = torch.empty_like(x)
    buf = new_buffer("softmax", x.device)
    _softmax_launch(x, y, buf, variant=10, rows=True)
    return y, read_sketch("softmax", buf, x.shape)


def _deferred(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, pending buffer) of the row launch without its finisher."""
    y = torch.empty_like(x)
    buf = _softmax_launch(x, y, None, variant=10, rows=True, defer=True)
    return y, buf


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def _special(n_rows: int, n: int, name: str) -> torch.Tensor:
    """bf16 rows with masks, an HF mask (finfo.min: the HUGE rows), a fully masked row and flagged rows
    (NaN / +inf) in the first and later polls."""
    g = seed(name, n_rows, n)
    x = torch.randn(n_rows, n, generator=g) * torch.logspace(-1, 2, n_rows)[:, None]
    x[::5, : n // 3] = -math.inf
    x[1, n // 2:] = torch.finfo(torch.bfloat16).min
    x[2] = -math.inf
    x[3, 7] = math.nan
    x[n_rows - 1, 0] = math.inf
    return x.to(torch.bfloat16)


def test_deferred_pages_match_the_in_launch_finisher_bit_for_bit():
    """Calls of several shapes pending on one page at once; reading one settles them all."""
    xs = [_special(41, 300, "a"), _special(RECORD_POLL + 9, 64, "b"), _special(6, 1000, "c")]
    ref = [_in_launch(x) for x in xs]
    got = [_deferred(x) for x in xs]
    assert all(deferred.pending(b) for _, b in got)
    first = read_sketch("softmax", got[0][1], xs[0].shape)
    assert not any(deferred.pending(b) for _, b in got)  # one page: one settle finished all three
    assert _same(first, ref[0][1])
    for x, (y_ref, sk_ref), (y, buf) in zip(xs, ref, got):
        assert torch.equal(bits(y), bits(y_ref))
        assert _same(read_sketch("softmax", buf, x.shape), sk_ref)
    assert deferred.leftover() == (0, 0)


def test_a_full_page_settles_and_its_buffers_outlive_the_next_batch(monkeypatch):
    """PAGE_CALLS + 2 calls: the first page settles when the next call reserves; a buffer of the first
    batch still holds its sketch after the second batch settled; waiters run at the settle."""
    monkeypatch.setattr(deferred, "PAGE_CALLS", 3)
    monkeypatch.setattr(deferred, "_PAGES", {})
    xs = [_special(6 + k, 40, f"page{k}") for k in range(5)]
    ran: list[int] = []
    bufs = []
    for k, x in enumerate(xs):
        _, buf = _deferred(x)
        deferred.when_settled(buf, lambda k=k: ran.append(k))
        bufs.append(buf)
        if k == 3:  # the fourth call found the page full: the first three settled before it
            assert ran == [0, 1, 2] and deferred.pending(buf) and not deferred.pending(bufs[0])
    deferred.settle_all()
    assert ran == [0, 1, 2, 3, 4]
    for x, buf in zip(xs, bufs):
        assert _same(read_sketch("softmax", buf, x.shape), _in_launch(x)[1])
    deferred.when_settled(bufs[0], lambda: ran.append(99))  # not pending: at once
    assert ran[-1] == 99 and deferred.leftover() == (0, 0)


def test_a_call_with_more_rows_than_the_page_grows_it(monkeypatch):
    monkeypatch.setattr(deferred, "MIN_PAGE_ROWS", 8)
    monkeypatch.setattr(deferred, "_PAGES", {})
    small, big = _special(6, 48, "small"), _special(70, 48, "big")
    (_, b_small), (_, b_big) = _deferred(small), _deferred(big)
    assert not deferred.pending(b_small)  # settled before the page grew
    assert _same(read_sketch("softmax", b_big, big.shape), _in_launch(big)[1])
    assert _same(read_sketch("softmax", b_small, small.shape), _in_launch(small)[1])
    assert deferred.leftover() == (0, 0)


def test_launches_without_a_row_program_each_finish_in_launch():
    """The persistent launch (and an fp32 row, which has no packed layout) ignores defer: its buffer is
    final at once; the public function defers only with the sketch."""
    x = _special(9, 200, "persistent")
    y = torch.empty_like(x)
    buf = _softmax_launch(x, y, None, variant=10, rows=False, defer=True)
    assert not deferred.pending(buf)
    y32, buf32 = softmax(x.float(), defer=True)
    assert not deferred.pending(buf32) and read_sketch("softmax", buf32, x.shape)["rows"] == 9
    y_plain, none = softmax(x, sketch=False, defer=True)
    assert none is None and torch.equal(bits(y_plain), bits(y))


def test_bad_requests_fail_in_one_line():
    x = _special(5, 32, "bad")
    with pytest.raises(InputError, match="defer makes its own sketch buffer"):
        _softmax_launch(x, torch.empty_like(x), new_buffer("softmax", "cpu"), defer=True)
    with pytest.raises(InputError, match="no deferred finisher"):
        deferred.reserve("rmsnorm", torch.device("cpu"), 4, 32, words=1)


def test_launches_past_max_rows_finish_in_launch(monkeypatch):
    """A launch with more rows than deferred.MAX_ROWS keeps its finisher (a settle's serial polls would cost
    more than it); one at the limit defers."""
    monkeypatch.setattr(deferred, "MAX_ROWS", 6)
    x = _special(7, 40, "max-rows")
    _, buf = _deferred(x)
    assert not deferred.pending(buf) and _same(read_sketch("softmax", buf, x.shape), _in_launch(x)[1])
    _, buf6 = _deferred(x[:6])
    assert deferred.pending(buf6)
    deferred.settle_all()


def test_settle_stale_settles_only_batches_past_their_age():
    x = _special(6, 40, "stale")
    _, buf = _deferred(x)
    deferred.settle_stale(1e9)
    assert deferred.pending(buf)
    deferred.settle_stale(0.0)
    assert not deferred.pending(buf) and _same(read_sketch("softmax", buf, x.shape), _in_launch(x)[1])


def test_a_settled_block_is_reused_once_no_caller_holds_its_buffers(monkeypatch):
    """A new batch takes a settled batch's features block only when no buffer of it, nor a tensor made from
    one, is held: a held buffer keeps its features through later batches; a dropped block comes back."""
    monkeypatch.setattr(deferred, "PAGE_CALLS", 2)
    monkeypatch.setattr(deferred, "_PAGES", {})
    x = _special(6, 40, "reuse")
    want = _in_launch(x)[1]
    _, a = _deferred(x)
    _, b = _deferred(x)
    first = id(a._base)
    deferred.settle_all()
    kept = b.view(-1)[:4]  # a tensor made from a buffer (not the buffer object itself)
    held = kept.clone()
    del a, b
    _, c = _deferred(x)
    assert id(c._base) != first  # the first block is held through `kept`: a fresh one
    deferred.settle_all()
    _, d = _deferred(x)
    assert id(d._base) not in (first, id(c._base))  # c holds the second
    deferred.settle_all()
    assert torch.equal(kept, held)  # two later batches settled; the held features are intact
    assert _same(read_sketch("softmax", c, x.shape), want) and _same(read_sketch("softmax", d, x.shape), want)
    del kept, c
    _, e = _deferred(x)
    assert id(e._base) == first  # nothing holds the oldest block any more: it comes back
    assert _same(read_sketch("softmax", e, x.shape), want)
    assert deferred.leftover() == (0, 0)


def test_a_settle_from_another_thread_waits_for_the_launch(monkeypatch):
    """A settle from another thread (a monitor flushed from a reporting thread) while a deferred call sits between
    its reservation and its launch waits for the launch: its page's finisher is never queued ahead of the rows
    whose records it polls (on a GPU it would wait for them forever)."""
    import threading

    import optwin.kernels.launch_plan as lp
    import optwin.kernels.softmax as sm

    x = _special(6, 40, "thread")
    want = _in_launch(x)[1]
    events: list[str] = []
    real_launch, real_finish = lp.launch_keyed, deferred._FINISHERS["softmax"]

    def launch(key, kernel, grid, args, kwargs):
        if kernel is sm._softmax_kernel and kwargs.get("ROWS") and grid[0] == x.shape[0]:  # the deferred rows
            other = threading.Thread(target=deferred.settle_all)
            other.start()
            other.join(0.3)  # time for it to settle now, were nothing holding it back
            out = real_launch(key, kernel, grid, args, kwargs)
            events.append("rows")
            monkeypatch.setattr(lp, "launch_keyed", real_launch)
            launch.other = other
            return out
        return real_launch(key, kernel, grid, args, kwargs)

    def finish(page, features, desc, calls):
        events.append("finisher")
        if "rows" in events:  # else the interpreter's finisher would poll for records never written
            real_finish(page, features, desc, calls)

    monkeypatch.setattr(lp, "launch_keyed", launch)
    monkeypatch.setitem(deferred._FINISHERS, "softmax", finish)
    _, buf = _deferred(x)
    launch.other.join()
    assert events == ["rows", "finisher"]
    assert _same(read_sketch("softmax", buf, x.shape), want) and deferred.leftover() == (0, 0)
