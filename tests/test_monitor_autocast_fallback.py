"""policy="fallback" under torch.autocast: the float32 rerun must not be cast back down by autocast.

    python -m pytest -q tests/test_monitor_autocast_fallback.py

nn.Linear(256, 8) of all-ones weights on x = 300 under autocast(float16) runs a float16 GEMM whose
every output is 76800: inf. The monitor predicts it (a small real database of matmul/torch/float16
cases, outcomes from the float16 rounding of the exact product) and reruns the call in float32; with
autocast still on, F.linear cast the upcast inputs straight back to float16 and the rerun overflowed
the same way.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import optwin.monitor as om
from _matcher_fixture import REPLAYS, write_db
from optwin.ingest import sketch

WIDTH = 256


def _case(c: float) -> dict:
    """Linear(WIDTH, 8) of all-ones weights on a constant input c, as a matmul/torch/float16 case."""
    a = torch.full((4, WIDTH), c, dtype=torch.float16)  # (rows, k)
    b = torch.ones(WIDTH, 8, dtype=torch.float16)  # (k, n): the weight, transposed
    y = (a.double() @ b.double()).half()  # exact product rounded to float16: inf past 65504
    bad = not bool(torch.isfinite(y).all())
    return {"op": "matmul", "variant": "torch", "dtype": "float16", "params": {},
            "sketch": sketch("matmul", {"a": a, "b": b}), "det": {"nonfinite": bad, "precision_loss": False},
            "counts": {"nonfinite": REPLAYS * bad, "precision_loss": 0}, "rel": 0.0}


def _ones_linear(dtype: torch.dtype) -> nn.Linear:
    """Linear(WIDTH, 8) of all-ones weights and no bias: 300 in every input gives 76800, past float16's range."""
    lin = nn.Linear(WIDTH, 8).to(dtype)
    with torch.no_grad():
        lin.weight.fill_(1.0)
        lin.bias.zero_()
    return lin


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("fp") / "matmul.duckdb")
    # c from 1 to 1024 on a grid of 2^(1/16), every value twice (every 5th case is held out)
    write_db(path, cases=[_case(2.0 ** (i / 16)) for i in range(161) for _ in range(2)])
    return path


def test_fallback_under_autocast_gives_finite_output(db):
    lin = _ones_linear(torch.float32)
    x = torch.full((4, WIDTH), 300.0)  # float32 inputs: autocast makes it a float16 GEMM
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        assert not bool(torch.isfinite(lin(x)).any())  # the fault is real
        with om.monitor(lin, db=db, policy="fallback", sampling="always", ops=("matmul",)) as mon:
            y = lin(x)
        assert torch.is_autocast_enabled("cpu")  # the fallback restored autocast
    assert mon.stats.fallbacks == 1
    assert bool(torch.isfinite(y).all()), "the float32 rerun was cast back to float16 by autocast"
    assert y.double().sub(76800.0).abs().max() == 0.0


def test_fallback_of_half_inputs_under_autocast_keeps_the_float32_result(db):
    # float16 inputs and weights: the rerun's float32 76800 cast back to the inputs' float16 is inf again
    lin = _ones_linear(torch.float16)
    x = torch.full((4, WIDTH), 300.0, dtype=torch.float16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        with om.monitor(lin, db=db, policy="fallback", sampling="always", ops=("matmul",)) as mon:
            y = lin(x)
    assert mon.stats.fallbacks == 1
    assert y.dtype == torch.float32 and bool(torch.isfinite(y).all())


def test_fallback_outside_autocast_casts_back_to_the_inputs_dtype(db):
    # without autocast the model's float16 contract holds: the result comes back in float16 (here still inf:
    # 76800 is past float16's range however it is computed)
    lin = _ones_linear(torch.float16)
    x = torch.full((4, WIDTH), 300.0, dtype=torch.float16)
    with torch.no_grad(), om.monitor(lin, db=db, policy="fallback", sampling="always", ops=("matmul",)) as mon:
        y = lin(x)
    assert mon.stats.fallbacks == 1 and y.dtype == torch.float16
