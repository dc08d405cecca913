"""A database holding an operator this optwin does not know (written by a newer optwin) still renders.

    python -m pytest -x -q tests/test_dashboard_unknown_op.py

The operator pickers list the known operators and say in one line which were left out; no traceback.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from test_dashboard_fixture import make_db
from test_dashboard_pages import app


@pytest.fixture(scope="module")
def unknown_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = make_db(tmp_path_factory.mktemp("unk") / "fp.duckdb", n_builds=1, n_cases=20)
    # as a newer optwin adding an operator would write it: softmax's rows renamed to an op we lack
    with duckdb.connect(str(path)) as c:
        for t in ("fingerprints", "cases", "representatives"):
            c.execute(f"UPDATE {t} SET op = 'aaa_gemm' WHERE op = 'softmax'")
        c.execute("CHECKPOINT")
    return path


@pytest.mark.parametrize("page,key", [("pages/2_Operator_explorer.py", "ex_op"), ("pages/3_Cases.py", "cs_op")])
def test_pages_leave_out_an_unknown_operator(unknown_db: Path, page: str, key: str) -> None:
    at = app(unknown_db, page)  # asserts no exception
    assert at.selectbox(key=key).options == ["rmsnorm"]
    notes = [i.value for i in at.info if "aaa_gemm" in i.value]
    assert len(notes) == 1 and "unknown to this optwin" in notes[0]
