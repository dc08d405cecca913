"""intercept.eager_under_compile, the one helper that keeps dynamo out of the capture's hooks and
wrappers (capture's module hooks and transformers wrappers use it; intercept's own wrapper spells it out).

    python -m pytest -q tests/test_ingest_eager_under_compile.py
"""

from __future__ import annotations

import sys

import pytest
import torch

from optwin.ingest.intercept import eager_under_compile


def _pair(seen: list[tuple[str, bool]]):  # noqa: ANN202
    """fn and traced, each noting its name and whether dynamo was tracing it (is_compiling() is the
    constant True while dynamo traces, False in an eager call, disabled or not)."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(("fn", torch.compiler.is_compiling()))
        return x + 1

    def traced(x: torch.Tensor) -> torch.Tensor:
        seen.append(("traced", torch.compiler.is_compiling()))
        return x + 2

    return fn, traced


def test_eager_calls_run_fn() -> None:
    seen: list[tuple[str, bool]] = []
    g = eager_under_compile(*_pair(seen))
    x = torch.arange(4.0)
    assert torch.equal(g(x), x + 1) and torch.equal(g(x), x + 1)
    assert seen == [("fn", False)] * 2


def test_a_compiled_caller_runs_fn_eagerly() -> None:
    """Under torch.compile, fn runs outside dynamo (on the real tensors) at every call: it is not
    traced into the graph (where it would run once, with FakeTensors, is_compiling() True)."""
    import torch._dynamo

    torch._dynamo.reset()
    seen: list[tuple[str, bool]] = []
    g = eager_under_compile(*_pair(seen))
    f = torch.compile(lambda x: g(x * 2) * 3, backend="eager")
    x = torch.arange(4.0)
    try:
        assert torch.equal(f(x), (x * 2 + 1) * 3) and torch.equal(f(x), (x * 2 + 1) * 3)
    finally:
        torch._dynamo.reset()
    assert seen == [("fn", False)] * 2


def test_without_dynamo_loaded_a_compiled_caller_runs_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Made while torch._dynamo is not imported, there is nothing to disable fn with: a traced call runs
    `traced` (for a hook: skip it; for a wrapper: the original), and fn never sees dynamo's tensors."""
    import torch._dynamo

    torch._dynamo.reset()
    seen: list[tuple[str, bool]] = []
    with monkeypatch.context() as m:
        m.delitem(sys.modules, "torch._dynamo")
        g = eager_under_compile(*_pair(seen))
    f = torch.compile(lambda x: g(x * 2) * 3, backend="eager")
    x = torch.arange(4.0)
    try:
        assert torch.equal(f(x), (x * 2 + 2) * 3)
    finally:
        torch._dynamo.reset()
    assert seen and all(s == ("traced", True) for s in seen)
    assert torch.equal(g(x), x + 1) and seen[-1] == ("fn", False)  # eager calls still run fn
