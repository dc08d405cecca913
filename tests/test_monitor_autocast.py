"""The monitor labels a call under torch.autocast with the dtype it computes in, not its inputs'.

    python -m pytest -q tests/test_monitor_autocast.py

nn.Linear of float32 inputs under autocast(float16) runs a float16 GEMM (here every output is
76800 + bias: inf), but the monitor filed it under matmul/torch/float32 and so never looked at the
float16 fingerprints. The oracle is torch itself: the stream's dtype must be the dtype of the call's
output under the same autocast (CPU autocast; the CUDA-only float32 list is in
optwin.ingest.autocast_dtype's table).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import optwin.monitor as om

LOW = [torch.float16, torch.bfloat16]


def _dtypes(mon: om.Monitor, op: str) -> set[str]:
    return {k[3] for k in mon.streams if k[1] == op}


@pytest.mark.parametrize("low", LOW)
def test_linear_under_autocast_is_filed_under_the_autocast_dtype(db, low):
    lin = nn.Linear(256, 8)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    x = torch.full((4, 256), 300.0)  # float32 inputs; the float16 GEMM overflows
    with om.monitor(lin, db=db, sampling="always", ops=("matmul",)) as mon, torch.no_grad(), \
            torch.autocast("cpu", dtype=low):
        y = lin(x)
    assert y.dtype == low
    assert _dtypes(mon, "matmul") == {str(low).removeprefix("torch.")}
    assert mon.stats.checked == 1
    key = next(iter(mon.last_sketches))
    assert mon.last_sketches[key]["out_bound"] == pytest.approx(76800.0, rel=1e-6)  # sketched from the inputs


CALLS = {  # op -> a call on float32 inputs (seeded) and the kwargs-free torch function it goes through
    "matmul": lambda x: torch.matmul(x, x.T),
    "attention": lambda x: F.scaled_dot_product_attention(x[None, None], x[None, None], x[None, None]),
    "softmax": lambda x: F.softmax(x, -1),
    "layernorm": lambda x: F.layer_norm(x, (x.shape[-1],)),
}


@pytest.mark.parametrize("low", LOW)
@pytest.mark.parametrize("op", list(CALLS))
def test_stream_dtype_is_the_dtype_torch_computes_in(db, op, low):
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(5))
    with om.monitor(None, db=db, sampling="always", ops=(op,)) as mon, torch.no_grad(), torch.autocast("cpu", dtype=low):
        out = CALLS[op](x)
        asked = F.softmax(x, -1, dtype=torch.float32) if op == "softmax" else None
    assert _dtypes(mon, op) == {str(out.dtype).removeprefix("torch.")}  # matmul/attention: low; CPU softmax, layer_norm: float32 in, float32
    if asked is not None:
        assert asked.dtype == torch.float32  # dtype= is the call's dtype: autocast respects it


def test_float64_calls_stay_float64_under_autocast(db):
    # autocast never casts float64: the call stays out of the catalog's dtypes (skipped), as without autocast
    x = torch.randn(6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    with om.monitor(None, db=db, sampling="always", ops=("matmul",)) as mon, torch.autocast("cpu", dtype=torch.float16):
        assert torch.matmul(x, x.T).dtype == torch.float64
    assert mon.streams == {} and mon.stats.skipped == 1


def test_hf_eager_attention_under_autocast(db):
    # the wrapped eager attention hands its inputs lazily (GQA repeat); autocast reads q's device
    # from the call's arguments without making them
    from optwin.ingest.models import load_llama_tiny

    model = load_llama_tiny("eager").module
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(1))  # (batch, seq)
    with om.monitor(model, db=db, ops=("attention", "matmul")) as mon, torch.no_grad(), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids)
    assert _dtypes(mon, "attention") == _dtypes(mon, "matmul") == {"bfloat16"}
    assert mon.stats.skipped == 0
