"""The matcher's per-fault features (catalog `fault_features`) and the deterministic blend (det_weight):
fingerprint rows in, probabilities out, no database needed for the arithmetic."""

from __future__ import annotations

import pytest

from optwin.catalog import operator
from optwin.fingerprints.matcher import Matcher, MatcherConfig
from optwin.fingerprints.regions import region_key, region_of

BASE = {"numel": 512.0, "rows": 4.0, "absmax": 5.0, "rms": 1.0, "nonfinite": 0.0, "n": 128.0, "min": -5.0,
        "masked_rows": 0.0, "masked_frac": 0.0}


def _sk(max_logit: float, peaked: float) -> dict[str, float]:
    return {**BASE, "max": max_logit, "max_row_range": 10.0, "peaked_frac": peaked, "min_row_max": max_logit - 1.0}


def _rows(sk: dict[str, float], probs: dict[str, float], n_cases: int = 10, det: dict[str, int] | None = None):
    region = region_key(region_of("softmax", sk))
    return [{"op": "softmax", "variant": "torch", "dtype": "float16", "region": region, "fault_type": ft,
             "probability": p, "n_cases": n_cases, "n_replays": 8 * n_cases,
             "det_faults": None if det is None else det.get(ft, 0)} for ft, p in probs.items()]


def test_catalog_fault_features_are_subsets_of_region_features():
    for op in ("softmax", "attention"):
        spec = operator(op)
        assert spec.features_for("low_entropy") == ("peaked_frac",)
        for ft in spec.fault_types:
            assert set(spec.features_for(ft)) <= set(spec.region_features)
    assert operator("rmsnorm").features_for("precision_loss") == operator("rmsnorm").region_features


def test_low_entropy_comes_from_cells_pooled_over_the_other_features():
    peaked = _rows(_sk(2.0, 0.9), {"nonfinite": 0.0, "precision_loss": 0.0, "low_entropy": 1.0}, n_cases=10)
    flat = _rows(_sk(2.0, 0.1), {"nonfinite": 0.0, "precision_loss": 0.0, "low_entropy": 0.0}, n_cases=30)
    overflow = _rows(_sk(3000.0, 0.1), {"nonfinite": 1.0, "precision_loss": 0.0, "low_entropy": 0.0}, n_cases=10)
    m = Matcher.from_rows(peaked + flat + overflow, config=MatcherConfig(det_weight=0.0))
    # A large-logit sketch with peaked rows: its full cell was never replayed. low_entropy is answered by
    # the replayed cells sharing its peaked_frac bin (1.0), not by neighbours chosen by `max`.
    r = m.assess("softmax", "torch", "float16", sketch=_sk(3000.0, 0.9))
    assert not r.known and r.probability["low_entropy"] == 1.0
    assert r.probability["nonfinite"] > 0.5  # the joint neighbours still carry the overflow
    # The replayed flat cell keeps its own answer.
    assert m.assess("softmax", "torch", "float16", sketch=_sk(2.0, 0.1)).probability["low_entropy"] == 0.0


def test_pooled_cells_weigh_by_their_trials():
    a = _rows(_sk(2.0, 0.9), {"nonfinite": 0.0, "precision_loss": 0.0, "low_entropy": 1.0}, n_cases=10)
    b = _rows(_sk(40.0, 0.9), {"nonfinite": 0.0, "precision_loss": 0.0, "low_entropy": 0.0}, n_cases=30)
    m = Matcher.from_rows(a + b, config=MatcherConfig(det_weight=0.0))
    r = m.assess("softmax", "torch", "float16", sketch=_sk(2.0, 0.9))
    assert r.known and r.probability["low_entropy"] == pytest.approx(10 / 40)


@pytest.mark.parametrize("weight, expected", [(0.0, 0.125), (0.75, 0.75 * 0.4 + 0.25 * 0.125), (1.0, 0.4)])
def test_det_weight_blends_deterministic_and_noisy_outcomes(weight, expected):
    rows = _rows(_sk(2.0, 0.1), {"nonfinite": 0.125, "precision_loss": 0.0, "low_entropy": 0.0}, n_cases=10,
                 det={"nonfinite": 4})
    m = Matcher.from_rows(rows, config=MatcherConfig(det_weight=weight))
    assert m.assess("softmax", "torch", "float16", sketch=_sk(2.0, 0.1)).probability["nonfinite"] == pytest.approx(expected)


def test_rows_without_det_faults_keep_the_replay_probability():
    rows = _rows(_sk(2.0, 0.1), {"nonfinite": 0.125, "precision_loss": 0.0, "low_entropy": 0.0})  # schema v1 rows
    m = Matcher.from_rows(rows)
    assert m.assess("softmax", "torch", "float16", sketch=_sk(2.0, 0.1)).probability["nonfinite"] == 0.125


def test_fingerprints_binned_on_older_region_features_are_refused():
    rows = _rows(_sk(2.0, 0.1), {"nonfinite": 0.0, "precision_loss": 0.0, "low_entropy": 0.0})
    for r in rows:
        r["region"] = "|".join(r["region"].split("|")[:3])  # softmax before peaked_frac had 3 features
    from optwin.errors import DatabaseError

    with pytest.raises(DatabaseError, match=r"softmax \(build old\) binned on other region features.*optwin build"):
        Matcher.from_rows(rows, build_id="old")


@pytest.mark.parametrize("noisy, warns", [(1.0, True), (0.8, False)])
def test_default_threshold_warns_when_every_noisy_replay_faults(noisy, warns):
    """The default threshold is 1 - det_weight: a cell whose deterministic emulation never faults
    still warns when all of its noisy replays do (run-to-run variation is real elsewhere), and no
    longer when only most of them do."""
    rows = _rows(_sk(2.0, 0.1), {"nonfinite": noisy, "precision_loss": 0.0, "low_entropy": 0.0}, n_cases=10,
                 det={"nonfinite": 0})
    cfg = MatcherConfig()
    assert cfg.threshold == pytest.approx(1.0 - cfg.det_weight)
    r = Matcher.from_rows(rows, config=cfg).assess("softmax", "torch", "float16", sketch=_sk(2.0, 0.1))
    assert r.warn is warns
