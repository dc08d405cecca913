"""A small real build into a DuckDB file, checked against itself by SQL: fingerprints summarise outcomes.

    python -m pytest -q tests/test_build_database.py
"""

from __future__ import annotations

import json
import os

import duckdb
import pytest

from optwin.catalog import all_triples, operator
from optwin.fingerprints.build import BuildConfig, build
from optwin.fingerprints.regions import region_key, region_of
from optwin.fingerprints.stats import wilson

OPS = ("rmsnorm", "softmax", "geodesic")
CFG = dict(ops=OPS, cases=12, replays=6, seed=11, workers=2)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("build") / "fp.duckdb")
    result = build(BuildConfig(out=out, **CFG))
    return out, result


def _q(path: str, sql: str, params=()) -> list[tuple]:
    with duckdb.connect(path, read_only=True) as c:
        return c.execute(sql, list(params)).fetchall()


def test_every_triple_of_the_selected_ops_is_covered(built):
    out, result = built
    got = set(_q(out, "SELECT DISTINCT op, variant, dtype FROM cases"))
    assert got == {t for t in all_triples() if t[0] in OPS}
    assert result.cases == _q(out, "SELECT count(*) FROM cases")[0][0] == _q(out, "SELECT count(*) FROM outcomes")[0][0]
    assert _q(out, "SELECT count(*), count(DISTINCT case_id) FROM cases") == [(result.cases, result.cases)]
    assert result.shards_skipped == 0 and result.shards_run > 0
    assert not os.path.exists(out + ".work") and not [p for p in os.listdir(os.path.dirname(out)) if ".tmp-" in p]


def test_fingerprints_agree_with_the_outcomes_they_summarise(built):
    out, _ = built
    recomputed = _q(out, """
        WITH t AS (
          SELECT c.op, c.variant, c.dtype, c.region, f.fault_type,
                 CASE WHEN o.replays > 0 THEN CASE f.fault_type WHEN 'nonfinite' THEN o.n_nonfinite
                      WHEN 'precision_loss' THEN o.n_precision_loss ELSE o.n_low_entropy END
                      ELSE CASE f.fault_type WHEN 'nonfinite' THEN o.det_nonfinite::INT
                      WHEN 'precision_loss' THEN o.det_precision_loss::INT ELSE o.det_low_entropy::INT END END AS k,
                 greatest(o.replays, 1) AS n
          FROM cases c JOIN outcomes o USING (build_id, case_id)
          JOIN (SELECT DISTINCT op, fault_type FROM fingerprints) f ON f.op = c.op
          WHERE NOT c.held_out)
        SELECT op, variant, dtype, region, fault_type, count(*), sum(n), sum(k) FROM t
        GROUP BY ALL ORDER BY ALL""")
    stored = _q(out, "SELECT op, variant, dtype, region, fault_type, n_cases, n_replays, n_faults FROM fingerprints "
                     "ORDER BY ALL")
    assert stored == recomputed and len(stored) > 10
    # fault types per op are the catalog's, and faults exist at all (the sweep reaches boundaries)
    types = dict(_q(out, "SELECT op, list(DISTINCT fault_type ORDER BY fault_type) FROM fingerprints GROUP BY op"))
    assert {op: sorted(operator(op).fault_types) for op in OPS} == types
    assert _q(out, "SELECT sum(n_faults) FROM fingerprints")[0][0] > 0


def test_probabilities_and_wilson_intervals(built):
    out, _ = built
    rows = _q(out, "SELECT n_faults, n_replays, probability, ci_low, ci_high, n_cases FROM fingerprints")
    for k, n, p, lo, hi, cases in rows:
        assert p == k / n
        assert 0.0 <= lo <= p <= hi <= 1.0
        elo, ehi = wilson(k, n, n_eff=cases)  # the cases are the sample, not their replays
        assert lo == pytest.approx(elo, abs=1e-12) and hi == pytest.approx(ehi, abs=1e-12)
    assert any(hi > wilson(k, n)[1] + 0.01 for k, n, _, _, hi, _ in rows)  # wider than replays as trials gave
    assert any(0 < k < n for k, n, *_ in rows) or any(k == n for k, n, *_ in rows)


def test_regions_sketches_and_feature_ranges(built):
    out, _ = built
    for op, region, sketch in _q(out, "SELECT op, region, sketch FROM cases"):
        assert region_key(region_of(op, json.loads(sketch))) == region
    # feature_lo/hi bound the region features of the region's non-held-out cases
    by_cell: dict[tuple, list[dict]] = {}
    for op, variant, dtype, region, sketch in _q(out, "SELECT op, variant, dtype, region, sketch FROM cases WHERE NOT held_out"):
        by_cell.setdefault((op, variant, dtype, region), []).append(json.loads(sketch))
    fps = _q(out, "SELECT op, variant, dtype, region, feature_lo, feature_hi FROM fingerprints WHERE fault_type = 'nonfinite'")
    assert {fp[:4] for fp in fps} == set(by_cell)
    for op, variant, dtype, region, lo, hi in fps:
        sk = by_cell[(op, variant, dtype, region)]
        lo, hi = json.loads(lo), json.loads(hi)
        assert list(lo) == list(operator(op).region_features)
        for f in lo:
            assert lo[f] == pytest.approx(min(s[f] for s in sk)) and hi[f] == pytest.approx(max(s[f] for s in sk))


def test_held_out_cases_are_about_a_fifth_and_shared_across_variants(built):
    out, _ = built
    (frac,) = _q(out, "SELECT avg(held_out::INT) FROM cases")[0]
    assert 0.08 < frac < 0.35
    # the same input (op, dtype, source, seed, case_index) is held out for every variant or none
    mixed = _q(out, "SELECT op, dtype, source, seed, case_index FROM cases GROUP BY ALL "
                    "HAVING count(DISTINCT held_out) > 1")
    assert mixed == []
    from optwin.fingerprints.store import open_store

    with open_store(out) as s:
        ho = s.held_out_cases()
        assert ho and all(r["held_out"] for r in ho) and "det_precision_loss" in ho[0]


def test_representatives_are_failing_cases_of_their_cell(built):
    out, _ = built
    bad = _q(out, """
        SELECT r.* FROM representatives r JOIN cases c USING (build_id, case_id) JOIN outcomes o USING (build_id, case_id)
        WHERE c.region != r.region OR c.op != r.op OR c.variant != r.variant OR c.dtype != r.dtype OR c.held_out
           OR NOT (CASE r.fault_type WHEN 'nonfinite' THEN o.n_nonfinite WHEN 'precision_loss' THEN o.n_precision_loss
                   ELSE o.n_low_entropy END > 0)""")
    assert bad == []
    assert _q(out, "SELECT max(c) FROM (SELECT count(*) c FROM representatives GROUP BY op, variant, dtype, region, "
                   "fault_type)")[0][0] <= 3
    cells_with_faults = _q(out, "SELECT count(*) FROM fingerprints WHERE n_faults > 0")[0][0]
    cells_with_reps = _q(out, "SELECT count(*) FROM (SELECT DISTINCT op, variant, dtype, region, fault_type FROM representatives)")[0][0]
    assert cells_with_reps == cells_with_faults > 0


def test_a_case_is_reproducible_from_its_provenance(built):
    out, result = built
    import optwin.ingest as ingest

    (flags, seed, twin_version, code_version, replays, engine), = _q(
        out, "SELECT flags, seed, twin_version, code_version, replays, engine FROM builds")
    flags = json.loads(flags)
    assert seed == 11 and replays == 6 and engine == "local" and flags["ops"] == list(OPS) and twin_version and code_version
    rows = _q(out, "SELECT op, dtype, source, seed, case_index, sketch, params FROM cases ORDER BY case_id LIMIT 5")
    for op, dtype, source, gseed, idx, sketch, params in rows:
        gen = ingest.default_sweep if source == "default" else ingest.boundary_sweep
        case = gen(op, dtype, flags["cases"], gseed)[idx]
        again = ingest.sketch(op, case.inputs, json.loads(params))
        assert json.loads(sketch) == pytest.approx(again)


def test_a_second_build_appends_and_becomes_current(built, tmp_path):
    out, first = built
    import shutil

    copy = str(tmp_path / "two.duckdb")
    shutil.copyfile(out, copy)
    second = build(BuildConfig(out=copy, ops=("geodesic",), cases=4, replays=2, seed=1, workers=1))
    from optwin.fingerprints.store import open_store

    with open_store(copy) as s:
        assert [b["build_id"] for b in s.builds()] == [first.build_id, second.build_id]
        assert s.latest_build_id() == second.build_id
        assert {f["op"] for f in s.fingerprints()} == {"geodesic"}
        assert len(s.fingerprints(first.build_id)) == len(s.fingerprints(first.build_id, as_arrow=True))


def test_cli_build_prints_a_summary_table(tmp_path):
    import typer
    from typer.testing import CliRunner

    from optwin.fingerprints.cli import build_command

    app = typer.Typer()
    app.command("build")(build_command)
    app.command("other")(lambda: None)  # two commands: `build` stays a subcommand
    out = tmp_path / "cli.duckdb"
    r = CliRunner().invoke(app, ["build", "--ops", "geodesic", "--cases", "3", "--replays", "2", "--workers", "1",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "geodesic" in r.output and "haversine" in r.output and "fingerprint rows" in r.output
    assert out.exists()


def test_summary_rates_are_over_the_trials_run_even_with_no_replays(tmp_path):
    """With --replays 0 each case is one deterministic trial (its flag counts once, as in the fingerprints): the
    summary's rates are faults over cases, never fault counts shown as rates (> 1)."""
    result = build(BuildConfig(out=str(tmp_path / "fp.duckdb"), ops=("rmsnorm",), cases=16, replays=0, seed=2,
                               workers=2))
    assert result.replays == 0 and result.summary
    assert any(k > 1 for r in result.summary for k in r["faults"].values()), "the check needs rows with 2+ faults"
    for r in result.summary:
        assert r["replays"] == 0 and r["cases"] > 0
        for f, k in r["faults"].items():
            assert r["rates"][f] == pytest.approx(k / r["cases"]) and 0.0 <= r["rates"][f] <= 1.0
