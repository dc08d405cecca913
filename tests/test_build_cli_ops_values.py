"""`optwin build --ops a b` builds both operators: the spec's `[--ops ...]`, beside `--ops a,b` and `--ops a --ops b`.

    python -m pytest -q tests/test_build_cli_ops_values.py

A click option takes one value, so `optwin build --quick --ops matmul geodesic` stopped with
`error: Got unexpected extra argument(s) (geodesic)`. The builds here are the smallest real ones (one case, one
replay, one worker).
"""

from __future__ import annotations

import json

import pytest

from optwin.cli import main
from optwin.fingerprints.store import open_store

SMALL = ["--cases", "1", "--replays", "1", "--workers", "1"]


@pytest.mark.parametrize("ops", [
    ["--ops", "geodesic", "matmul"],  # values up to the next option
    ["--ops=geodesic", "matmul"],
    ["--ops", "geodesic", "--ops", "matmul"],  # the forms that already worked still do
    ["--ops", "geodesic,matmul"],
])
def test_ops_forms_build_both(tmp_path, ops: list[str]) -> None:
    out = str(tmp_path / "fp.duckdb")
    with pytest.raises(SystemExit) as e:
        main(["build", "--quick", *ops, *SMALL, "--out", out])
    assert e.value.code == 0
    with open_store(out, read_only=True) as store:
        (build,) = store.builds()
        assert json.loads(build["flags"])["ops"] == ["geodesic", "matmul"]
        assert {r["op"] for r in store.fingerprints()} == {"geodesic", "matmul"}


def test_a_stray_value_after_another_option_is_still_refused(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fp.duckdb"
    with pytest.raises(SystemExit) as e:
        main(["build", "--ops", "geodesic", "--out", str(out), "matmul"])  # matmul follows --out's value, not --ops
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: Got unexpected extra argument(s) (matmul)"), err
    assert not out.exists()
