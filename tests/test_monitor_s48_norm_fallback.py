"""A patched norm whose forward runs the model's own code on a call (a bfloat16 input with float32 weights) is
recorded as the unpatched norm's call, by a monitor and by a capture.

    python -m pytest -q tests/test_monitor_s48_norm_fallback.py

optwin.kernels.patch leaves such calls to the module's own code (torch's mixed-type LayerNorm, HF's float32
weight product: optwin.kernels.patching, kernel_runs). The capture hooks took every call of a patched module for
the kernel's: under a monitor they left its sketch to the kernel and suppressed the F.layer_norm inside, and the
kernel never ran, so the call went unseen; under a capture it was recorded as the triton variant. A call the
kernel does take (parameters in the input's dtype) is still the kernel's. Our Triton kernels run under
TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import optwin.kernels  # noqa: E402
import optwin.monitor as om  # noqa: E402
from _matcher_fixture import cached_db  # noqa: E402
from optwin.ingest.capture import capture  # noqa: E402

HIDDEN = 64
FORWARDS = 3


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return cached_db(str(tmp_path_factory.mktemp("fp") / "fp.duckdb"))


def _norm(kind: str) -> nn.Module:
    """A float32 norm (weights away from 1, so the patch's probe and the sketches see a real affine)."""
    if kind == "layernorm":
        m = nn.LayerNorm(HIDDEN)
    else:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        m = LlamaRMSNorm(HIDDEN)
    with torch.no_grad():
        m.weight.copy_(torch.linspace(0.5, 2.0, HIDDEN))
    return m.eval()


X = torch.randn(2, 5, HIDDEN, generator=torch.Generator().manual_seed(0)).bfloat16()  # (2, 5, HIDDEN)


def _monitored(db: str, m: nn.Module) -> tuple[list, int]:
    """The streams a monitor made over FORWARDS calls of m, and how many calls it checked."""
    with torch.no_grad(), om.Monitor(m, db=db, sampling="always") as mon:
        for _ in range(FORWARDS):
            m(X)
    return list(mon.streams), mon.stats.checked


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_monitor_records_a_patched_norm_that_runs_the_models_code(db, kind):
    m = _norm(kind)  # float32 weights under a bfloat16 input: the patched forward runs the module's own code
    want_streams, want_checked = _monitored(db, m)
    assert want_checked == FORWARDS
    with optwin.kernels.patch(m) as h:
        got_streams, got_checked = _monitored(db, m)
        assert not h.calls  # the kernel never ran
    assert got_checked == FORWARDS and got_streams == want_streams


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_capture_records_the_unpatched_variant(kind):
    m = _norm(kind)

    def variants() -> list[tuple[str, str, str]]:
        with torch.no_grad(), capture(m) as rec:
            m(X)
        return [(r["op"], r["variant"], r["dtype"]) for r in rec.records()]

    want = variants()
    with optwin.kernels.patch(m):
        assert variants() == want and len(want) == 1


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_a_call_the_kernel_takes_is_still_the_kernels(db, kind):
    m = _norm(kind).bfloat16()  # parameters in the input's dtype: the kernel runs, and hands the monitor its sketch
    with optwin.kernels.patch(m) as h:
        streams, checked = _monitored(db, m)
    assert h.calls == {kind: FORWARDS} and h.sketched == {kind: FORWARDS} and checked == FORWARDS
    assert [k[1:] for k in streams] == [(kind, "triton", "bfloat16")]
