"""twin.run end to end for every catalog triple of softmax, attention, matmul and rmsnorm, and its errors.

    python -m pytest -q tests/test_twin_run.py
"""

from __future__ import annotations

import math

import pytest
import torch

from optwin import twin
from optwin.catalog import CATALOG, all_triples, resolve_params
from optwin.errors import CatalogError, InputError

OPS = ("softmax", "attention", "matmul", "rmsnorm")
TRIPLES = [t for t in all_triples() if t[0] in OPS]
DT = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def sample(op: str, dtype: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(DT[dtype])
    if op == "softmax":
        x = r(3, 5, 40)
        x[0, 1, 30:] = -math.inf  # a partial mask
        return {"x": x}
    if op == "attention":
        return {"q": r(1, 2, 6, 16), "k": r(1, 2, 9, 16), "v": r(1, 2, 9, 16)}
    if op == "matmul":
        return {"a": r(7, 70), "b": r(70, 5)}
    if op == "rmsnorm":
        return {"x": r(4, 64), "weight": r(64)}
    raise AssertionError(op)


def out_shape(op: str, inputs: dict[str, torch.Tensor]) -> tuple[int, ...]:
    if op == "attention":
        return (*inputs["q"].shape[:-1], inputs["v"].shape[-1])
    if op == "matmul":
        return (inputs["a"].shape[0], inputs["b"].shape[1])
    return tuple(inputs["x"].shape)


def test_triples_cover_the_catalog() -> None:
    want = sum(len(CATALOG[op].variants) * len(CATALOG[op].dtypes) for op in OPS)
    assert len(TRIPLES) == want == 3 * 3 + 3 * 3 + 1 * 3 + 3 * 3


@pytest.mark.parametrize(("op", "variant", "dtype"), TRIPLES)
def test_run_end_to_end(op: str, variant: str, dtype: str) -> None:
    inputs = sample(op, dtype)
    res = twin.run(op, variant, dtype, inputs, noise="stochastic", replays=4, seed=1, keep_replays=True)
    shape = out_shape(op, inputs)
    assert (res.op, res.variant, res.dtype, res.noise) == (op, variant, dtype, "stochastic")
    assert res.exact.dtype == res.emulated.dtype == torch.float64
    assert res.exact.shape == res.emulated.shape == shape
    assert torch.isfinite(res.emulated).all()
    # The emulated output holds values of the output dtype (one store in dtype at the end).
    assert torch.equal(res.emulated, res.emulated.to(DT[dtype]).double())
    assert set(res.faults) == set(CATALOG[op].fault_types)
    assert not res.faults["nonfinite"] and not res.faults["precision_loss"]
    assert 0 < res.rel_error < 16 * {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}[dtype]
    assert res.replays.shape == (4, *shape)
    assert set(res.replay_faults) == set(res.faults)
    assert all(v.shape == (4,) and v.dtype == torch.bool for v in res.replay_faults.values())
    assert set(res.probability) == set(res.faults)
    assert all(0.0 <= p <= 1.0 for p in res.probability.values())
    assert res.replay_rel_error.shape == (4,)
    # Deterministic run: no replays, probability is the flags.
    det = twin.run(op, variant, dtype, inputs)
    assert torch.equal(det.emulated, res.emulated) and det.replays is None
    assert det.probability == {k: float(v) for k, v in det.faults.items()}


@pytest.mark.parametrize("op", OPS)
def test_noise_none_replays_repeat_the_emulation(op: str) -> None:
    variant = CATALOG[op].variants[0].name
    res = twin.run(op, variant, "float16", sample(op, "float16"), replays=3, keep_replays=True)
    assert torch.equal(res.replays, res.emulated.expand(3, *res.emulated.shape))


def test_params_reach_the_twin() -> None:
    inputs = sample("attention", "float32")
    a = twin.run("attention", "sdpa", "float32", inputs, {"causal": True})
    b = twin.run("attention", "sdpa", "float32", inputs)
    assert not torch.equal(a.exact, b.exact) and not torch.equal(a.emulated, b.emulated)


# -- wrong input: one clear error that names the op ---------------------------------------


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_unknown_op_and_variant_and_dtype() -> None:
    with pytest.raises(CatalogError) as e:
        twin.run("softmaxx", "torch", "float16", {"x": torch.zeros(2, 2).half()})
    assert "softmaxx" in one_line(e) and "softmax" in one_line(e)
    with pytest.raises(CatalogError) as e:
        twin.run("softmax", "flash", "float16", {"x": torch.zeros(2, 2).half()})
    assert one_line(e).startswith("softmax") and "flash" in one_line(e)
    with pytest.raises(CatalogError) as e:
        twin.run("matmul", "torch", "float64", {"a": torch.zeros(2, 2).double(), "b": torch.zeros(2, 2).double()})
    assert one_line(e).startswith("matmul") and "float64" in one_line(e)
    with pytest.raises(CatalogError) as e:
        twin.run("attention", "sdpa", "float16", sample("attention", "float16"), {"causl": True})
    assert one_line(e).startswith("attention") and "causl" in one_line(e)


def test_missing_and_extra_inputs() -> None:
    with pytest.raises(InputError) as e:
        twin.run("attention", "math", "float16", {"q": torch.zeros(1, 1, 2, 4).half(), "k": torch.zeros(1, 1, 2, 4).half()})
    assert one_line(e).startswith("attention") and "'v'" in one_line(e)
    with pytest.raises(InputError) as e:
        twin.run("softmax", "torch", "float16", {"x": torch.zeros(2, 2).half(), "mask": torch.zeros(2, 2).half()})
    assert one_line(e).startswith("softmax") and "mask" in one_line(e)


def test_wrong_dtype_and_shape() -> None:
    with pytest.raises(InputError) as e:
        twin.run("softmax", "torch", "float16", {"x": torch.zeros(2, 2)})
    assert one_line(e).startswith("softmax") and "float16" in one_line(e)
    with pytest.raises(InputError) as e:
        twin.run("matmul", "torch", "float32", {"a": torch.zeros(3, 4), "b": torch.zeros(5, 2)})
    assert one_line(e).startswith("matmul") and "k" in one_line(e)
    with pytest.raises(InputError) as e:
        twin.run("matmul", "torch", "float32", {"a": torch.zeros(2, 3, 4), "b": torch.zeros(4, 2)})
    assert one_line(e).startswith("matmul")
    with pytest.raises(InputError) as e:
        twin.run("attention", "sdpa", "float32", {"q": torch.zeros(1, 1, 2, 4), "k": torch.zeros(1, 1, 3, 8),
                                                  "v": torch.zeros(1, 1, 3, 8)})
    assert one_line(e).startswith("attention")
    with pytest.raises(InputError) as e:
        twin.run("rmsnorm", "fp32-acc", "float32", {"x": torch.zeros(2, 8), "weight": torch.zeros(4)})
    assert one_line(e).startswith("rmsnorm")
    with pytest.raises(InputError) as e:
        twin.run("softmax", "torch", "float32", {"x": torch.zeros(0, 4)})
    assert one_line(e).startswith("softmax") and "empty" in one_line(e)


def test_non_finite_where_forbidden() -> None:
    x = torch.zeros(2, 4).half()
    for bad in (math.nan, math.inf):
        y = x.clone()
        y[0, 1] = bad
        with pytest.raises(InputError) as e:
            twin.run("softmax", "naive", "float16", {"x": y})
        assert one_line(e).startswith("softmax") and "-inf masks are allowed" in one_line(e)
    a = torch.zeros(2, 2)
    a[1, 1] = -math.inf  # -inf is a mask only for softmax
    with pytest.raises(InputError) as e:
        twin.run("matmul", "torch", "float32", {"a": a, "b": torch.zeros(2, 2)})
    assert one_line(e).startswith("matmul") and "'a'" in one_line(e)
    q = torch.zeros(1, 1, 2, 4)
    q[0, 0, 0, 0] = math.nan
    with pytest.raises(InputError) as e:
        twin.run("attention", "sdpa", "float32", {"q": q, "k": torch.zeros(1, 1, 2, 4), "v": torch.zeros(1, 1, 2, 4)})
    assert one_line(e).startswith("attention") and "'q'" in one_line(e)


@pytest.mark.parametrize("kwargs,msg", [
    ({"noise": "gaussian"}, "unknown noise mode 'gaussian'"),
    ({"noise": None}, "unknown noise mode None"),
    ({"replays": -1}, "replays must be an int in"),
    ({"replays": True}, "replays must be an int in"),  # a bool is an int to Python, not a count
    ({"replays": 2.0}, "replays must be an int in"),
    ({"seed": None}, "seed must be an int in"),
    ({"seed": 2**70}, "seed must be an int in"),  # past torch.Generator's range
])
def test_bad_noise_replays_and_seed_are_catalog_errors(kwargs, msg) -> None:
    with pytest.raises(CatalogError, match=f"^matmul: {msg}") as e:
        twin.run("matmul", "torch", "float16", sample("matmul", "float16"), **kwargs)
    assert "\n" not in str(e.value)


def test_numpy_counts_are_counts() -> None:
    import numpy as np

    inputs = sample("matmul", "float16")
    a = twin.run("matmul", "torch", "float16", inputs, noise="stochastic", replays=np.int64(3), seed=np.int32(5))
    b = twin.run("matmul", "torch", "float16", inputs, noise="stochastic", replays=3, seed=5)
    assert torch.equal(a.replay_rel_error, b.replay_rel_error)


@pytest.mark.parametrize("causal", ["false", 2, 0.5, None])
def test_causal_must_be_a_flag(causal) -> None:
    q = torch.randn(1, 1, 4, 8).half()
    with pytest.raises(CatalogError, match="causal must be true or false"):
        twin.run("attention", "math", "float16", {"q": q, "k": q, "v": q}, params={"causal": causal})
    r0 = twin.run("attention", "math", "float16", {"q": q, "k": q, "v": q}, params={"causal": 0})
    rf = twin.run("attention", "math", "float16", {"q": q, "k": q, "v": q}, params={"causal": False})
    assert torch.equal(r0.emulated, rf.emulated)


@pytest.mark.parametrize("noise", ["stochastic", "mca", "order"])
@pytest.mark.parametrize("op", OPS)
def test_replays_in_batches_are_the_unbatched_replays(monkeypatch, op: str, noise: str) -> None:
    """Noisy replays run in batches bounded by twin.REPLAY_BATCH_BYTES (all of them at once held
    replays x the input's float64 size a dozen times over: 10,000 replays of a 64x4096 rmsnorm were an
    OOM kill). Each replay draws from its own generator, so any split gives the unbatched run's
    replays, faults and errors bit for bit; here batches of one and of three (the last one short)."""
    variant = CATALOG[op].variants[0].name
    inputs = sample(op, "float16")
    whole = twin.run(op, variant, "float16", inputs, noise=noise, replays=7, seed=3, keep_replays=True)
    x = twin.to_float64(inputs)
    one = twin.replay_bytes(x, *twin.references(op, x, resolve_params(op, {})))
    sizes: list[int] = []
    real = twin.Numerics

    def spy(noise: str, replays: int = 0, *args, **kwargs):
        sizes.append(replays)
        return real(noise, replays, *args, **kwargs)

    monkeypatch.setattr(twin, "Numerics", spy)
    for budget, want in ((1, [0] + [1] * 7), (3 * one + 1, [0, 3, 3, 1])):
        sizes.clear()
        monkeypatch.setattr(twin, "REPLAY_BATCH_BYTES", budget)
        part = twin.run(op, variant, "float16", inputs, noise=noise, replays=7, seed=3, keep_replays=True)
        assert sizes == want  # the deterministic emulation, then the batches
        assert torch.equal(part.replays, whole.replays)
        assert torch.equal(part.replay_rel_error, whole.replay_rel_error)
        assert all(torch.equal(part.replay_faults[k], v) for k, v in whole.replay_faults.items())
    assert whole.replay_rel_error.unique().numel() > 1 or noise == "order"


@pytest.mark.parametrize("params", [[1], "abc", [], 3.0, {1: 2, "eps": 3}])
def test_params_not_a_mapping_of_names_is_a_catalog_error(params) -> None:
    """`params` that is not a dict of names gets one CatalogError line naming the op, where dict(params)
    raised a raw TypeError (a list) or ValueError (a string)."""
    with pytest.raises(CatalogError) as e:
        twin.run("rmsnorm", "fp32-acc", "float16", sample("rmsnorm", "float16"), params=params)
    assert one_line(e).startswith("rmsnorm: ") and ("must be a dict" in one_line(e) or "unknown params" in one_line(e))


def test_tolerances_as_a_mapping_of_their_fields() -> None:
    """tolerances= takes a dict of Tolerances fields (the rest the spec's defaults) as well as a
    Tolerances, where a dict raised AttributeError; an unknown field, a bad value or another type is
    one CatalogError line."""
    from optwin.catalog import Tolerances

    inputs = sample("matmul", "float16")
    tight = twin.run("matmul", "torch", "float16", inputs, tolerances={"precision_loss_ulps": 1e-3})
    same = twin.run("matmul", "torch", "float16", inputs, tolerances=Tolerances(precision_loss_ulps=1e-3))
    assert tight.faults == same.faults and tight.faults["precision_loss"]  # far tighter than the rounding
    assert not twin.run("matmul", "torch", "float16", inputs, tolerances={}).faults["precision_loss"]
    for bad, msg in (({"precision_ulps": 1}, "unknown tolerances"), ({"geodesic_rel": -1.0}, "finite number >= 0"),
                     ({"geodesic_rel": "x"}, "finite number >= 0"), ({"low_entropy_nats": True}, "finite number >= 0"),
                     ({"geodesic_rel": 10 ** 400}, "finite number >= 0"),  # an int past float's range
                     (16.0, "must be a Tolerances or a dict")):
        with pytest.raises(CatalogError) as e:
            twin.run("matmul", "torch", "float16", inputs, tolerances=bad)
        assert one_line(e).startswith("matmul: ") and msg in one_line(e)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_inputs_are_refused() -> None:
    """A sparse (or other non-strided) input is one InputError line, where validation's value check
    raised NotImplementedError from the sparse backend."""
    a, b = torch.randn(2, 3), torch.randn(3, 2)
    for sparse, layout in ((a.to_sparse(), "sparse_coo"), (a.to_sparse_csr(), "sparse_csr")):
        with pytest.raises(InputError) as e:
            twin.run("matmul", "torch", "float32", {"a": sparse, "b": b})
        assert one_line(e).startswith("matmul: input 'a'") and layout in one_line(e)
