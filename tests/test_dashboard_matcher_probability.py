"""The dashboard shows the probability the matcher serves, beside the replays' fault rate, labelled apart.

    python -m pytest -x -q tests/test_dashboard_matcher_probability.py

The matcher blends a cell's noisy replays with its deterministic emulation (MatcherConfig.det_weight), so
its probability and n_faults / n_replays can fall on opposite sides of the 0.25 it warns at. Every number
here is checked against the real matcher (`Matcher.open` of the same file, `TripleIndex.lookup`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_dashboard_fixture import direct, make_db, served
from test_dashboard_pages import app, metrics

TRIPLE = ("rmsnorm", "native-dtype", "float16")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_db(tmp_path_factory.mktemp("served") / "fp.duckdb")


def _table(at, column: str):
    """The first table on the page with this column (st.dataframe keys do not reach AppTest's elements)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def test_explorer_shows_what_the_matcher_serves(db: Path) -> None:
    cells = served(db, "build-2")
    at = app(db, "pages/2_Operator_explorer.py")
    at.selectbox(key="ex_variant").set_value("native-dtype").run()
    at.selectbox(key="ex_fault").set_value("precision_loss").run()
    assert not at.exception
    regions = _table(at, "region").set_index("region")
    rows = direct(db, "SELECT region, n_faults, n_replays FROM fingerprints WHERE build_id = 'build-2' AND op = ? AND "
                      "variant = ? AND dtype = ? AND fault_type = 'precision_loss'", list(TRIPLE))
    assert len(regions) == len(rows)
    for reg, k, n in rows:
        assert regions.loc[reg, "P(fault), matcher"] == pytest.approx(cells[(*TRIPLE, reg, "precision_loss")])
        assert regions.loc[reg, "P(fault), replays"] == pytest.approx(k / n)
    # the two disagree about warning (0.25) somewhere in this fixture: the labels matter
    split = [r for r, k, n in rows if (k / n >= 0.25) != (cells[(*TRIPLE, r, "precision_loss")] >= 0.25)]
    assert split
    # headline numbers: the matcher's probability pooled with the replays as weights, and the replays' rate
    m = metrics(at)
    k_all, n_all = sum(k for _, k, _ in rows), sum(n for _, _, n in rows)
    pooled = sum(cells[(*TRIPLE, r, "precision_loss")] * n for r, _, n in rows) / n_all
    assert m["P(fault), matcher"] == f"{pooled:.4f}" and m["P(fault), replays"] == f"{k_all / n_all:.4f}"
    # the boundary is of the matcher's probability at its own threshold by default
    assert at.radio(key="ex_value").value == "p_matcher" and at.slider(key="ex_threshold").value == 0.25
    by_bin: dict[float, list[float]] = {}
    for reg, _, n in rows:
        edge = float(regions.loc[reg, "absmax"])
        acc = by_bin.setdefault(edge, [0.0, 0.0])
        acc[0] += cells[(*TRIPLE, reg, "precision_loss")] * n
        acc[1] += n
    expect = min(e for e, (w, n) in by_bin.items() if w / n >= 0.25)
    assert float(m["Boundary"].split("≥")[1]) == pytest.approx(expect, rel=1e-3)


def test_softmax_marginal_fault_type_is_the_matcher_s_pooled_cell(db: Path) -> None:
    """low_entropy of softmax is served from its own features (peaked_frac): the table shows that cell's value."""
    cells = served(db, "build-2")
    at = app(db, "pages/2_Operator_explorer.py")
    at.selectbox(key="ex_op").set_value("softmax").run()
    at.selectbox(key="ex_fault").set_value("low_entropy").run()
    assert not at.exception
    regions = _table(at, "region")
    assert len(regions)
    for reg, p in zip(regions["region"], regions["P(fault), matcher"]):
        assert p == pytest.approx(cells[("softmax", "torch", "float16", reg, "low_entropy")])


def test_compare_shows_both_builds_matcher_probabilities(db: Path) -> None:
    a, b = served(db, "build-1"), served(db, "build-2")
    at = app(db, "pages/5_Compare_builds.py")
    at.multiselect(key="cmp_status").set_value(["changed", "same"]).run()
    table = _table(at, "p_matcher_a")
    assert len(table)
    for r in table.itertuples():
        key = (r.op, r.variant, r.dtype, r.region, r.fault_type)
        assert (r.p_matcher_a, r.p_matcher_b) == pytest.approx((a[key], b[key]))
        assert r.delta == pytest.approx(b[key] - a[key])
    ra, rb = direct(db, "SELECT a.probability, b.probability FROM fingerprints a JOIN fingerprints b USING (op, variant, "
                        "dtype, region, fault_type) WHERE a.build_id = 'build-1' AND b.build_id = 'build-2' AND op = ? "
                        "AND variant = ? AND dtype = ? AND region = ? AND fault_type = ?", list(key))[0]
    assert (r.p_replays_a, r.p_replays_b) == pytest.approx((ra, rb))
