"""layernorm's deferred finishing (optwin.kernels.deferred) under TRITON_INTERPRET=1: the Welford row launch
without its finisher's polls (its extra program takes only the parameters' partials), the records of a page of
calls reduced by one batched finisher launch later. Its features are bit for bit the in-launch finisher's (the
same code over the same records, in the same order), with flagged rows and parameters' NaN; every record word
and workspace slot is back at rest after.

    python -m pytest -q tests/test_kernels_layernorm_deferred.py
"""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest
import torch
from _kernel_checks import bits, seed

from optwin.errors import InputError
from optwin.ingest import sketch as ingest_sketch
from optwin.kernels import deferred, read_sketch
from optwin.kernels.layernorm import _layernorm_launch, layernorm
from optwin.kernels.sketch_buffer import new_buffer

N = 4096  # the Welford launch's shortest rows: four pieces of 1024 (twin.numerics.welford_chunk)


def _rows(n_rows: int, name: str, dtype: torch.dtype = torch.bfloat16, flagged: bool = True) -> torch.Tensor:
    """Rows of several scales; flagged: a constant row and a NaN row (exact partials in the workspace)."""
    g = seed("ln-deferred", name, n_rows)
    x = torch.randn(n_rows, N, generator=g) * torch.logspace(-1, 2, n_rows)[:, None] + 0.5
    if flagged:
        x[1] = 3.0
        x[n_rows - 1, 7] = math.nan
    return x.to(dtype)


def _params(name: str, nan: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = seed("ln-deferred-params", name)
    w, b = torch.randn(N, generator=g), torch.randn(N, generator=g) * 0.1
    if nan:
        w[5] = math.nan
    return w, b


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def _in_launch(x, w, b) -> tuple[torch.Tensor, dict[str, float]]:
    y = torch.empty_like(x)
    buf = new_buffer("layernorm", x.device)
    _layernorm_launch(x, w, b, y, buf, 1e-5)
    return y, read_sketch("layernorm", buf, x.shape)


def test_deferred_layernorm_matches_the_in_launch_finisher_bit_for_bit():
    """Four calls pending on one page (parameters with and without NaN, rows with and without flagged ones);
    reading one settles them all; the features equal the in-launch finisher's and agree with ingest's."""
    calls = [(_rows(9, "a"), *_params("a", False)), (_rows(5, "b"), *_params("b", True)),
             (_rows(3, "c", torch.float32), *_params("c", False)), (_rows(4, "d", flagged=False), *_params("d", True))]
    ref = [_in_launch(*c) for c in calls]
    got = []
    for x, w, b in calls:
        y, buf = layernorm(x, w, b, 1e-5, defer=True)
        got.append((y, buf))
    assert all(deferred.pending(buf) for _, buf in got)
    first = read_sketch("layernorm", got[0][1], calls[0][0].shape)
    assert not any(deferred.pending(buf) for _, buf in got)  # one page: one settle finished all three
    assert _same(first, ref[0][1])
    for (x, w, b), (y_ref, sk_ref), (y, buf) in zip(calls, ref, got):
        assert torch.equal(bits(y), bits(y_ref))
        sk = read_sketch("layernorm", buf, x.shape)
        assert _same(sk, sk_ref)
        want = ingest_sketch("layernorm", {"x": x, "weight": w, "bias": b})
        assert sk["nonfinite"] == want["nonfinite"] == int(x.isnan().sum() + w.isnan().sum())
        assert sk["const_absmax"] == want["const_absmax"]
        assert math.isclose(sk["weight_absmax"], want["weight_absmax"], rel_tol=1e-6)
    assert deferred.leftover() == (0, 0)


def test_layernorm_defer_falls_back_where_the_launch_has_no_records():
    """Rows the Welford launch does not take (here 100 wide) sketch in the launch: the buffer comes back
    final; a caller's own buffer with defer is a clear error."""
    g = seed("ln-deferred-short")
    x, w, b = torch.randn(4, 100, generator=g), torch.ones(100), torch.zeros(100)
    _, buf = layernorm(x, w, b, defer=True)
    assert buf is not None and not deferred.pending(buf)
    assert _same(read_sketch("layernorm", buf, x.shape), read_sketch("layernorm", layernorm(x, w, b)[1], x.shape))
    with pytest.raises(InputError, match="defer makes its own sketch buffer"):
        _layernorm_launch(x, w, b, torch.empty_like(x), new_buffer("layernorm", "cpu"), 1e-5, defer=True)


def test_a_held_buffer_is_not_reused_and_later_pages_go_on(monkeypatch):
    """A caller that keeps one call's buffer keeps its block out of reuse; the blocks after it are reused
    around it (found by identity: a block holds tensors, which have no truth value to compare by)."""
    monkeypatch.setattr(deferred, "PAGE_CALLS", 4)  # pages of 4 calls: several settles in a few calls
    w, b = _params("held", nan=False)
    x0 = _rows(1, "held-0", flagged=False)
    _, kept = layernorm(x0, w, b, defer=True)
    want = _in_launch(x0, w, b)[1]
    for i in range(1, 6 * 4 + 1):  # six pages: blocks retire and come back while `kept` holds its own
        _, buf = layernorm(_rows(1, f"held-{i}", flagged=False), w, b, defer=True)
    assert _same(read_sketch("layernorm", kept, x0.shape), want)
    assert read_sketch("layernorm", buf, (1, N))["numel"] == N
