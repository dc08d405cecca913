"""Fitted distributions and sample_inputs: synthetic sketches reproduce captured ones (two-sample KS).

    python -m pytest -q tests/test_ingest_fit.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import ks_2samp

from optwin.catalog import CATALOG
from optwin.ingest import default_sweep, fit_profile, fit_sketches, read_profile, sample_inputs, sketch
from optwin.ingest.capture import capture
from optwin.ingest.fit import UNTARGETED_FEATURES
from optwin.ingest.models import default_texts, load_model
from optwin.ingest.profile import sketch_frame
from optwin.ingest.sketch import SKETCH_FEATURES

N_SYNTH = 500  # KS sampling noise at 95%: 1.36 / sqrt(500) ~ 0.06 against the captured ECDF
KS_MAX = 0.1


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    texts = default_texts(48)
    out = {}
    for spec in ("minilm", "llama-tiny"):
        lm = load_model(spec)
        with torch.no_grad(), capture(lm.module) as rec:
            for batch in lm.batches(texts, 8):
                lm.module(**batch)
        out[spec] = rec.write_profile(tmp_path_factory.mktemp(spec), model=spec)
    return out


def _measured(op: str) -> list[str]:
    """The op's region features a sketch measures (the derived ones, regions.DERIVED, follow from these)."""
    return [f for f in CATALOG[op].region_features if f in SKETCH_FEATURES[op]]


def _ks(op: str, captured: dict[str, np.ndarray], cases) -> dict[str, float]:  # noqa: ANN001
    sk = [sketch(op, c.inputs, c.params) for c in cases]
    return {f: float(ks_2samp(captured[f], np.array([s[f] for s in sk])).statistic) for f in _measured(op)
            if f not in UNTARGETED_FEATURES}


# MiniLM's padded batches are recorded per run of batch rows over their live tokens (capture's _attention_parts,
# tests/test_capture_s49_encoder_padding.py): 276 attention records here, mostly one batch row of 12-61 tokens, with
# peaked_frac up to 0.15. Rescaling random query rows within the drawn norms left a quarter of the draws more than
# 0.01 short (KS 0.17); generate._steer_rows turns the rest toward a key (tests/test_s49_peaked_frac_aim.py).
@pytest.mark.parametrize("model,op", [("minilm", "matmul"), ("minilm", "layernorm"),
                                      ("minilm", "attention"),
                                      ("llama-tiny", "rmsnorm"), ("llama-tiny", "rope"), ("llama-tiny", "attention"),
                                      ("llama-tiny", "matmul")])
def test_samples_reproduce_captured_distributions(profiles: dict[str, Path], model: str, op: str) -> None:
    prof = read_profile(profiles[model])
    fitted = fit_profile(prof)
    dtype = prof.features(op).height and prof.sketches.filter(prof.sketches["op"] == op)["dtype"][0]
    assert dtype == "float32"
    cases = sample_inputs(op, dtype, fitted, N_SYNTH, seed=5)
    assert len(cases) == N_SYNTH and all(c.family.startswith("profile-sample:") for c in cases)
    captured = {f: prof.features(op)[f].to_numpy() for f in _measured(op)}
    ks = _ks(op, captured, cases)
    assert max(ks.values()) <= KS_MAX, ks


@pytest.mark.parametrize("op", ["softmax", "geodesic"])
def test_samples_reproduce_swept_distributions(op: str) -> None:
    """Ops the two models never call: fit sketches of default-sweep inputs (masks, near-identical
    and antipodal points), then sample."""
    cases = default_sweep(op, "float32", 300, 1)
    rows = [{"op": op, "variant": CATALOG[op].variants[0].name, "dtype": "float32", "stream": "s", "call_index": i,
             "t": float(i), "sketch": sketch(op, c.inputs, c.params)} for i, c in enumerate(cases)]
    frame = sketch_frame(rows)
    fitted = fit_sketches(frame)
    captured = {f: frame[f].to_numpy() for f in _measured(op)}
    ks = _ks(op, captured, sample_inputs(op, "float32", fitted, N_SYNTH, seed=2))
    assert max(ks.values()) <= KS_MAX, ks


def test_fit_reports_tails_and_structure(profiles: dict[str, Path]) -> None:
    fitted = fit_profile(profiles["minilm"])
    mm = fitted.fits[("matmul", "torch", "float32")]
    ob = mm.features["out_bound"]
    assert ob.kind == "log" and ob.t_params is not None and ob.tail is not None  # enough calls for a GPD tail
    assert mm.features["k"].kind == "discrete" and set(np.unique(mm.features["k"].values)) == {384.0, 1536.0}
    assert mm.structure["absmax_over_rms_q05_50_95"][1] > 1
    att = fitted.fits[("attention", "sdpa", "float32")]
    assert att.structure["causal_frac"] == 0.0
    s = fitted.summary()
    assert "matmul/torch/float32" in s and s["matmul/torch/float32"]["n"] == mm.n
    # Copula keeps dependence: out_bound rises with k in MiniLM (the 1536-wide down projection).
    draws = mm.draw(np.random.default_rng(0), 2000)
    k = np.array([d["k"] for d in draws])
    ob_draw = np.array([d["out_bound"] for d in draws])
    cap = read_profile(profiles["minilm"]).features("matmul")
    cap_k, cap_ob = cap["k"].to_numpy(), cap["out_bound"].to_numpy()
    assert np.sign(np.median(ob_draw[k == 1536]) - np.median(ob_draw[k == 384])) == np.sign(
        np.median(cap_ob[cap_k == 1536]) - np.median(cap_ob[cap_k == 384]))


def test_sampling_is_deterministic_and_casts(profiles: dict[str, Path]) -> None:
    fitted = fit_profile(profiles["llama-tiny"])
    a = sample_inputs("rmsnorm", "float16", fitted, 6, seed=9)
    b = sample_inputs("rmsnorm", "float16", fitted, 6, seed=9)
    for x, y in zip(a, b):
        assert all(torch.equal(x.inputs[k], y.inputs[k]) for k in x.inputs)
        assert x.inputs["x"].dtype == torch.float16 and x.inputs["x"].shape[0] <= 64
    r = sample_inputs("rope", "bfloat16", fitted, 4, seed=1)
    assert all(c.inputs["positions"].dtype == torch.int64 and c.inputs["x"].dtype == torch.bfloat16 for c in r)
    with pytest.raises(Exception, match="no layernorm calls"):
        sample_inputs("layernorm", "float32", fitted, 2, seed=0)


@pytest.mark.parametrize("n_cases", [-1, 2.5, True])
def test_sample_inputs_needs_a_count(n_cases) -> None:
    from optwin.errors import ProfileError

    cases = default_sweep("softmax", "float32", 20, 1)
    rows = [{"op": "softmax", "variant": "torch", "dtype": "float32", "stream": "s", "call_index": i, "t": float(i),
             "sketch": sketch("softmax", c.inputs, c.params)} for i, c in enumerate(cases)]
    fitted = fit_sketches(sketch_frame(rows))
    assert sample_inputs("softmax", "float32", fitted, 0, seed=0) == []
    with pytest.raises(ProfileError, match="n_cases must be an int >= 0"):
        sample_inputs("softmax", "float32", fitted, n_cases, seed=0)
