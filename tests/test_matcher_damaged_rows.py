"""Matcher.open on a fingerprint database whose rows were damaged by SQL: one DatabaseError line naming the file,
the table, the row and what is wrong, never a raw TypeError/ValueError and never a bad row served.

    python -m pytest -q tests/test_matcher_damaged_rows.py
"""

from __future__ import annotations

import shutil

import duckdb
import pytest

from _matcher_fixture import cached_db
from optwin.errors import DatabaseError
from optwin.fingerprints.matcher import Matcher

TRIPLE = ("rmsnorm", "native-dtype", "float16")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> str:
    return cached_db(str(tmp_path_factory.mktemp("fp") / "fp.duckdb"))


def _damage(pristine: str, path: str, assignment: str) -> str:
    """A copy of the fixture with one rmsnorm native-dtype precision_loss row changed by `assignment` (SQL SET);
    returns that row's region key."""
    shutil.copyfile(pristine, path)
    con = duckdb.connect(path)
    try:
        (region,), = con.execute("SELECT min(region) FROM fingerprints WHERE op = ? AND variant = ? AND dtype = ? "
                                 "AND fault_type = 'precision_loss'", list(TRIPLE)).fetchall()
        con.execute(f"UPDATE fingerprints SET {assignment} WHERE op = ? AND variant = ? AND dtype = ? AND region = ? "
                    "AND fault_type = 'precision_loss'", [*TRIPLE, region])
        assert con.execute("SELECT count(*) FROM fingerprints WHERE region = ?", [region]).fetchone()[0] >= 1
    finally:
        con.close()
    return region


@pytest.mark.parametrize("assignment, says", [
    ("probability = NULL", "probability is NULL"),  # was a raw TypeError from float(None)
    ("probability = 'nan'::DOUBLE", "probability nan is not in [0, 1]"),  # was served (NaN never warns)
    ("probability = 7.0", "probability 7.0 is not in [0, 1]"),  # was served as a certain fault
    ("probability = -0.5", "probability -0.5 is not in [0, 1]"),
    ("det_faults = n_cases + 3", "det_faults"),  # a blended probability past 1
    ("n_replays = -4", "n_replays -4 is not a count"),
    ("region = 'garbage'", "region 'garbage' is not a region key"),  # was a raw ValueError from int()
    ("region = NULL", "region is NULL"),
    ("fault_type = NULL", "fault_type is NULL"),
])
def test_a_damaged_row_is_one_database_error_naming_file_table_and_row(pristine, tmp_path, assignment, says):
    path = str(tmp_path / "damaged.duckdb")
    region = _damage(pristine, path, assignment)
    with pytest.raises(DatabaseError) as e:
        Matcher.open(path)
    msg = str(e.value)
    assert "\n" not in msg and says in msg, msg
    assert msg.startswith(f"{path}: table fingerprints, row rmsnorm/native-dtype/float16"), msg
    if "region" not in assignment and "fault_type" not in assignment:  # the row's key, as a user would query it
        assert f"region {region!r} fault type 'precision_loss' (build fixture-0)" in msg, msg
    assert "rebuild it with `optwin build`" in msg


@pytest.mark.parametrize("assignment, says", [
    ("op = 'gelu'", "unknown operator 'gelu'"),  # was a CatalogError naming neither the file nor why
    ("variant = 'flash-v9'", "flash-v9"),
    ("dtype = 'float8'", "float8"),
    ("fault_type = 'overflow'", "unknown fault type 'overflow'"),  # was skipped without a word
])
def test_a_name_this_optwin_does_not_know_says_the_database_may_be_newer(pristine, tmp_path, assignment, says):
    path = str(tmp_path / "newer.duckdb")
    _damage(pristine, path, assignment)
    with pytest.raises(DatabaseError) as e:
        Matcher.open(path)
    msg = str(e.value)
    assert "\n" not in msg and says in msg and msg.startswith(f"{path}: table fingerprints, row "), msg
    assert "may come from a newer optwin" in msg


def test_the_undamaged_copy_still_loads_every_row(pristine, tmp_path):
    # the checks refuse nothing a build writes: the same copy, edited to the same values, loads as before
    path = str(tmp_path / "same.duckdb")
    _damage(pristine, path, "probability = probability")
    m, before = Matcher.open(path), Matcher.open(pristine)
    assert m.index.keys() == before.index.keys()
    assert all(m.index[t].probs == before.index[t].probs for t in m.index)
    assert all(0.0 <= p <= 1.0 for ti in m.index.values() for ps in ti.probs.values() for p in ps)
