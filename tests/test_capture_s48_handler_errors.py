"""A failing capture handler never breaks the model's forward: counted in `skipped`, warned once.

    python -m pytest -q tests/test_capture_s48_handler_errors.py

The intercepted torch functions (softmax, sdpa, F.linear, ...) had a try/except around their handler;
the wrapped transformers functions (eager_attention_forward, apply_rotary_pos_emb) and the module
hooks (RMSNorm, the rotary module) had none, so a bug in one of them raised out of the user's forward.
"""

from __future__ import annotations

import importlib
import logging

import pytest
import torch

from optwin.ingest.capture import capture
from optwin.ingest.models import load_llama_tiny

# the module (optwin.monitor sets the package attribute `capture` to the function)
cap = importlib.import_module("optwin.ingest.capture")


def _logits(m: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return m(input_ids=ids).logits


def _handler_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "handler failed" in r.getMessage()]


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_a_raising_record_leaves_the_forward_as_it_was(impl: str, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Every recording path (module hooks, wrapped functions, intercepted torch functions) reaches
    Recorder.record: made to raise, the forward returns the uncaptured logits, every path's failure is
    counted and one warning says so."""
    m = load_llama_tiny(impl).module
    ids = torch.randint(1, 999, (2, 7), generator=torch.Generator().manual_seed(0))
    want = _logits(m, ids)

    def broken(self, op, *a, **k):  # noqa: ANN001, ANN202
        raise RuntimeError(f"bug recording {op}")

    monkeypatch.setattr(cap.Recorder, "record", broken)
    with caplog.at_level(logging.WARNING, logger="optwin.ingest.capture"), capture(m) as rec:
        got = _logits(m, ids)
    assert torch.equal(got, want)
    assert rec.records() == []
    failed = {k: n for k, n in rec.skipped.items() if "handler failed" in k}
    layers = m.config.num_hidden_layers
    by_op = {op: sum(n for k, n in failed.items() if k.startswith(f"{op}:")) for op in ("rmsnorm", "rope", "attention", "matmul")}
    # 2 norms a layer + the final one (module hooks); q and k's rope fail as one call of the wrapped function
    assert by_op["rmsnorm"] == 2 * layers + 1
    assert by_op["rope"] == layers
    assert by_op["attention"] == layers  # eager: the wrapped function; sdpa: the intercepted F.sdpa
    assert by_op["matmul"] == 7 * layers + 1  # intercepted F.linear
    assert len(_handler_warnings(caplog)) == 1


def test_a_failing_rotary_hook_skips_that_forwards_rope(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rotary module's pre-hook (base and verdict) and post-hook (its table) failing: the forward is
    the uncaptured one and rope is skipped, not recorded with what an earlier forward left behind."""
    m = load_llama_tiny("eager").module
    ids = torch.randint(1, 999, (1, 6), generator=torch.Generator().manual_seed(1))
    want = _logits(m, ids)

    def broken(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise ValueError("bug")

    with capture(m) as rec:
        _logits(m, ids)  # a good forward first: its table and verdict are what a stale one would reuse
        monkeypatch.setattr(cap, "_rope_reason", broken)
        monkeypatch.setattr(cap, "_keep_rope_table", broken)
        got = _logits(m, ids)
    assert torch.equal(got, want)
    ropes = [r for r in rec.records() if r["op"] == "rope"]
    assert len(ropes) == 2 * m.config.num_hidden_layers  # the good forward's only
    assert sum(n for k, n in rec.skipped.items() if k.startswith("rope:") and "handler failed" in k) == 2
    assert sum(n for k, n in rec.skipped.items() if k.startswith("rope:") and "handler failed" not in k) \
        == 2 * m.config.num_hidden_layers
    # the hooks' bookkeeping survived: later calls are recorded with their module paths
    norms = [r for r in rec.records() if r["op"] == "rmsnorm"]
    assert len(norms) == 2 * (2 * m.config.num_hidden_layers + 1) and norms[-1]["stream"] == "model.norm"
    assert rec.suppress == 0 and rec._stack == []
