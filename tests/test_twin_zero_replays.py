"""twin.run with replays=0 fills every replay field as with replays >= 1, only empty (api.md: replay_faults is
"fault type -> bool tensor [replays]", probability "res.faults when replays == 0"), for every catalog triple.

    python -m pytest -q tests/test_twin_zero_replays.py
"""

from __future__ import annotations

import math

import pytest
import torch

from optwin import twin
from optwin.catalog import CATALOG, all_triples

DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def sample(op: str, dtype: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Small valid inputs of op in dtype (scaled so some triples fault: the flags are not all False)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(DT[dtype])  # noqa: E731
    if op == "rmsnorm":
        return {"x": r(4, 64) * 300, "weight": r(64)}  # native-dtype float16 loses precision
    if op == "softmax":
        return {"x": r(3, 40) * 8}  # naive float16: exp(x) overflows past 11.09
    if op == "rope":
        return {"x": r(8, 2, 32), "positions": torch.randint(0, 5000, (8,), generator=g)}
    if op == "attention":
        return {"q": r(1, 2, 6, 16), "k": r(1, 2, 9, 16), "v": r(1, 2, 9, 16)}
    if op == "layernorm":
        return {"x": r(4, 64) + 3000, "weight": r(64), "bias": r(64)}  # |mean|/std ~ 3e3: one-pass cancels
    if op == "geodesic":
        lat = torch.rand(16, generator=g) * 120 - 60
        lon = torch.rand(16, generator=g) * 300 - 150
        return {"lat1": lat, "lon1": lon, "lat2": lat + 1e-3, "lon2": lon}
    if op == "matmul":
        return {"a": r(7, 70), "b": r(70, 5)}
    raise AssertionError(f"no sample for {op}: add one")


def test_every_catalog_op_has_a_sample() -> None:
    for op, spec in CATALOG.items():
        assert set(sample(op, spec.dtypes[0])) == set(spec.input_names())


@pytest.mark.parametrize("noise", ["none", "stochastic"])
@pytest.mark.parametrize(("op", "variant", "dtype"), all_triples())
def test_zero_replays_give_empty_replay_fields(op: str, variant: str, dtype: str, noise: str) -> None:
    inputs = sample(op, dtype)
    res = twin.run(op, variant, dtype, inputs, noise=noise, replays=0, seed=3)
    one = twin.run(op, variant, dtype, inputs, noise=noise, replays=1, seed=3, keep_replays=True)
    # Every fault type the op reports, as with one replay, each an empty bool tensor.
    assert set(res.replay_faults) == set(res.faults) == set(one.replay_faults) == set(CATALOG[op].fault_types)
    assert all(v.dtype == torch.bool and v.shape == (0,) for v in res.replay_faults.values())
    assert res.replay_rel_error.dtype == torch.float64 and res.replay_rel_error.shape == (0,)
    # No replays: the probability is the deterministic flags, as floats (not the NaN mean of nothing).
    assert res.probability == {k: float(v) for k, v in res.faults.items()}
    assert res.replays is None  # outputs are kept only on request
    kept = twin.run(op, variant, dtype, inputs, noise=noise, replays=0, keep_replays=True)
    assert kept.replays.dtype == torch.float64 and kept.replays.shape == (0, *res.exact.shape)
    # The rest is the replays=1 run's: the reference, the emulation and its flags do not depend on replays.
    # (Bit for bit, NaN included: softmax naive float16 overflows to NaN here.)
    torch.testing.assert_close(res.exact, one.exact, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(res.emulated, one.emulated, rtol=0, atol=0, equal_nan=True)
    assert res.faults == one.faults and res.noise == noise
    assert res.rel_error == one.rel_error or math.isnan(res.rel_error) and math.isnan(one.rel_error)


def test_zero_replay_probability_follows_the_faults() -> None:
    """A faulting deterministic run with replays=0 answers probability 1 for that fault (the spec's
    "res.faults when replays == 0"), 0 for the others."""
    res = twin.run("softmax", "naive", "float16", sample("softmax", "float16"), replays=0)  # exp(x) overflows
    assert res.probability == {"nonfinite": 1.0, "precision_loss": 0.0, "low_entropy": 1.0}


def test_a_hand_built_result_without_replay_faults_still_answers_the_flags() -> None:
    """TwinResult's default replay_faults ({}) keeps meaning "no replays"."""
    z = torch.zeros(2, dtype=torch.float64)
    res = twin.TwinResult("rmsnorm", "fp32-acc", "float16", z, z, {"nonfinite": True, "precision_loss": False})
    assert res.probability == {"nonfinite": 1.0, "precision_loss": 0.0}
