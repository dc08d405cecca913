"""Score math of `optwin validate` against hand-checkable examples, and scoring with a real Matcher.

    python -m pytest -q tests/test_validate_score.py
"""

from __future__ import annotations

import json
import random

import pytest

from optwin.errors import ProfileError
from optwin.fingerprints.matcher import Matcher
from optwin.validate.score import (auroc, brier, false_alarms, lead_time, read_collected, score_cases,
                                   score_collection, summarize, warn_confusion)


def test_auroc_hand_example():
    # positives at 0.9, 0.4; negatives at 0.8, 0.3, 0.1. Pairs (pos > neg): 0.9 beats all 3,
    # 0.4 beats 0.3 and 0.1 -> 5 of 6.
    assert auroc([0.9, 0.8, 0.4, 0.3, 0.1], [1, 0, 1, 0, 0]) == pytest.approx(5 / 6)


def test_auroc_ties_count_half():
    # one positive and one negative at the same score: 1/2; perfect and inverted rankings: 1 and 0.
    assert auroc([0.5, 0.5], [True, False]) == 0.5
    assert auroc([0.2, 0.2, 0.7], [0, 1, 1]) == pytest.approx((0.5 + 1) / 2)
    assert auroc([1, 2, 3, 4], [0, 0, 1, 1]) == 1.0
    assert auroc([4, 3, 2, 1], [0, 0, 1, 1]) == 0.0


def test_auroc_needs_both_classes():
    assert auroc([0.1, 0.2], [0, 0]) is None
    assert auroc([0.1, 0.2], [1, 1]) is None
    assert auroc([], []) is None


def test_auroc_matches_brute_force_pair_count():
    rng = random.Random(7)
    scores = [rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(60)]  # many ties
    labels = [rng.random() < 0.3 for _ in range(60)]
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    brute = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert auroc(scores, labels) == pytest.approx(brute)


def test_brier_and_warn_confusion():
    assert brier([1.0, 0.0, 0.5, 0.2], [1, 0, 1, 0]) == pytest.approx((0 + 0 + 0.25 + 0.04) / 4)
    assert brier([], []) is None
    c = warn_confusion([True, True, False, False, True], [True, False, True, False, True])
    assert (c["tp"], c["fp"], c["fn"], c["tn"]) == (2, 1, 1, 1)
    assert c["recall"] == pytest.approx(2 / 3) and c["precision"] == pytest.approx(2 / 3)
    none = warn_confusion([False, False], [False, False])
    assert none["recall"] is None and none["precision"] is None


def test_lead_time_early_late_and_without_fault():
    t = [i / 20 for i in range(10)]  # 20 calls/s
    early = lead_time(t, [0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    assert early["lead_s"] == pytest.approx(0.20) and early["early"] and not early["missed"]
    assert early["first_fault_t"] == pytest.approx(0.30) and early["sustained_lead_s"] == pytest.approx(0.20)
    same_call = lead_time(t, [0, 0, 0, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0, 0, 0, 0])
    assert same_call["lead_s"] == 0.0 and not same_call["early"]
    late = lead_time(t, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    assert late["lead_s"] is None and late["missed"] and late["late_s"] == pytest.approx(0.15)
    never = lead_time(t, [0] * 10, [0, 0, 1] + [1] * 7)
    assert never["missed"] and never["late_s"] is None
    no_fault = lead_time(t, [1] * 10, [0] * 10)
    assert no_fault["lead_s"] is None and not no_fault["missed"] and no_fault["first_fault_t"] is None


def test_lead_time_sustained_uses_episode_open_at_fault():
    t = [float(i) for i in range(10)]
    # an early blip at t=1 that ends, then an episode from t=5 covering the fault at t=7
    r = lead_time(t, [0, 1, 0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 1, 1, 1])
    assert r["lead_s"] == 6.0 and r["sustained_lead_s"] == 2.0


def test_false_alarms_calls_and_episodes():
    # two episodes on a stream that never faults
    fa = false_alarms([0, 1, 1, 0, 0, 1, 0], [0] * 7)
    assert fa == {"calls": 3, "episodes": 2}
    # an episode that contains a fault is not a false episode; its non-faulting calls are false calls
    fa = false_alarms([0, 1, 1, 1, 0], [0, 0, 1, 1, 0])
    assert fa == {"calls": 1, "episodes": 0}
    assert false_alarms([], []) == {"calls": 0, "episodes": 0}


def _rows(probability: float) -> list[dict]:
    """Fingerprints for softmax/naive/float16: one region (max logit 20) faulting with `probability`."""
    from optwin.fingerprints.regions import region_key, region_of

    sk = {"max": 20.0, "max_row_range": 3.0, "masked_rows": 0.0, "n": 128.0, "peaked_frac": 0.0, "min_row_max": 19.0}
    return [{"op": "softmax", "variant": "naive", "dtype": "float16", "region": region_key(region_of("softmax", sk)),
             "fault_type": ft, "probability": probability if ft == "nonfinite" else 0.0, "n_cases": 10}
            for ft in ("nonfinite", "precision_loss", "low_entropy")]


def _case(max_logit: float, nonfinite: bool) -> dict:
    sk = {"numel": 1024.0, "rows": 8.0, "absmax": max_logit, "rms": max_logit / 2, "nonfinite": 0.0, "n": 128.0,
          "max": max_logit, "min": max_logit - 3, "max_row_range": 3.0, "masked_rows": 0.0, "masked_frac": 0.0,
          "peaked_frac": 0.0, "min_row_max": 19.0}
    labels = {"nonfinite": nonfinite, "precision_loss": False, "low_entropy": False}
    return {"op": "softmax", "dtype": "float16", "family": "mixture", "case": 0, "params": {}, "sketch": sk,
            "outcomes": {"naive": {"labels": labels, "rel_error": None}, "torch": {"error": "RuntimeError: x"}}}


def test_score_cases_with_real_matcher():
    m = Matcher.from_rows(_rows(1.0))
    cases = [_case(20.0, True), _case(20.0, True), _case(20.5, False)]
    rows = score_cases(cases, lambda op, v, dt, sk: m.assess(op, v, dt, sketch=sk))
    assert len(rows) == 1  # the errored torch outcome is skipped
    r = rows[0]
    assert (r["op"], r["variant"], r["dtype"], r["n"], r["positives"]) == ("softmax", "naive", "float16", 3, 2)
    assert r["faults"]["nonfinite"]["positives"] == 2
    assert r["faults"]["nonfinite"]["auroc"] == 0.5  # same region, same probability: all ties
    assert r["warn"]["recall"] == 1.0 and r["warn"]["precision"] == pytest.approx(2 / 3)
    assert r["faults"]["nonfinite"]["brier"] == pytest.approx(1 / 3)
    assert r["known_frac"] == 1.0


def test_score_collection_traces_and_summary():
    m = Matcher.from_rows(_rows(1.0))
    calls = [{"i": i, "t": i / 20, "params": {}, "sketch": _case(20.0, False)["sketch"],
              "outcomes": {"naive": {"labels": {"nonfinite": i >= 5, "precision_loss": False, "low_entropy": False}}}}
             for i in range(10)]
    data = {"format": "optwin-validate-collect", "cases": [_case(20.0, True)],
            "traces": [{"name": "t", "op": "softmax", "dtype": "float16", "kind": "drift", "variants": ["naive"],
                        "calls": calls}]}
    rep = score_collection(data, m)
    tr = rep["traces"][0]
    assert tr["first_fault_t"] == pytest.approx(0.25) and tr["first_warn_t"] == 0.0
    assert tr["lead_s"] == pytest.approx(0.25) and tr["early"]
    assert tr["false_alarm_calls"] == 5 and tr["false_alarm_episodes"] == 0
    s = rep["summary"]
    assert s["faulting_streams"] == 1 and s["early_warnings"] == 1 and s["lead_s_median"] == pytest.approx(0.25)
    assert s["drift_faulting_streams"] == 1 and s["drift_early_warnings"] == 1 and s["flat_streams_with_faults"] == 0
    json.dumps(rep, allow_nan=False)  # the report is strict JSON


def test_a_faulting_flat_control_is_counted_apart_from_the_drift_traces():
    # the matcher never warns here (probability 0): the flat control's fault is unwarned, and it
    # must not count as a drift trace
    m = Matcher.from_rows(_rows(0.0))
    calls = [{"i": i, "t": i / 20, "params": {}, "sketch": _case(20.0, False)["sketch"],
              "outcomes": {"naive": {"labels": {"nonfinite": i == 7, "precision_loss": False, "low_entropy": False}}}}
             for i in range(10)]
    data = {"format": "optwin-validate-collect", "cases": [_case(20.0, True)],
            "traces": [{"name": "t", "op": "softmax", "dtype": "float16", "kind": "flat", "variants": ["naive"],
                        "calls": calls}]}
    s = score_collection(data, m)["summary"]
    assert s["drift_faulting_streams"] == 0 and s["faulting_streams"] == 1 and s["missed_streams"] == 1
    assert s["flat_streams_with_faults"] == 1 and s["flat_faults_unwarned"] == 1 and s["flat_false_alarm_calls"] == 0


def test_summarize_pools_rows():
    case_rows = [{"n": 4, "warn": {"tp": 1, "fp": 1, "fn": 0}, "faults": {"nonfinite": {"auroc": 0.8}}},
                 {"n": 6, "warn": {"tp": 2, "fp": 0, "fn": 2}, "faults": {"nonfinite": {"auroc": 0.6}}}]
    s = summarize(case_rows, [])
    assert s["cases"] == 10 and s["warn_recall"] == pytest.approx(3 / 5) and s["warn_precision"] == pytest.approx(3 / 4)
    assert s["auroc_median"]["nonfinite"] == pytest.approx(0.7)


def test_read_collected_refuses_other_files(tmp_path):
    with pytest.raises(ProfileError, match="no collection file"):
        read_collected(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="invalid JSON"):
        read_collected(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ProfileError, match="not a validation collection"):
        read_collected(other)


def _collection(**change) -> dict:
    calls = [{"i": i, "t": i / 20, "params": {}, "sketch": _case(20.0, False)["sketch"],
              "outcomes": {"naive": {"labels": {"nonfinite": False, "precision_loss": False, "low_entropy": False}}}}
             for i in range(3)]
    data = {"format": "optwin-validate-collect", "version": 1, "cases": [_case(20.0, True), _case(20.5, False)],
            "traces": [{"name": "t", "op": "softmax", "dtype": "float16", "kind": "drift", "variants": ["naive"],
                        "calls": calls}]}
    return {**data, **change}


def _with_case(**fields) -> dict:
    return _collection(cases=[{**_case(20.0, True), **fields}])


@pytest.mark.parametrize("data,match", [
    (_collection(version=99), "format version 99, this optwin reads 1"),
    (_collection(cases="x"), "cases: must be a list"),
    (_with_case(sketch=None), "case 0: needs a sketch object"),
    (_with_case(op="gelu"), "unknown operator 'gelu'"),
    # a label of another catalog would count as a fault in every warn score
    (_with_case(outcomes={"naive": {"labels": {"nonfinite": False, "weird_fault": True}}}),
     "label 'weird_fault' is no fault type of softmax"),
    (_with_case(outcomes={"naive": {"labels": {"nonfinite": "yes"}}}), "label nonfinite must be true or false"),
    (_with_case(outcomes={"naive": {"labels": {}}}), "labels must be an object of fault type"),
    (_with_case(sketch={"foo": "bar"}), "a corrupt record, not an older collection"),
    (_collection(traces=[{"name": "t", "op": "softmax", "calls": "x", "variants": []}]), "trace 0: needs calls"),
])
def test_read_collected_refuses_malformed_records(tmp_path, data, match):
    f = tmp_path / "c.json"
    f.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=match) as e:
        read_collected(f)
    assert "\n" not in str(e.value)


def test_read_collected_takes_what_the_collector_writes(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps(_collection()))
    data = read_collected(f)  # an errored outcome (no labels) is kept for the scorer to skip
    assert data["cases"][0]["outcomes"]["torch"] == {"error": "RuntimeError: x"}
