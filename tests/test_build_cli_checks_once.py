"""`optwin build` runs check_inputs once: the CLI checks before its progress display, and build() does not again.

    python -m pytest -q tests/test_build_cli_checks_once.py

check_inputs reads a profile's sketches (the NaN scan), so running it twice cost a second read of them.
"""

from __future__ import annotations

import pytest

import optwin.fingerprints.build as build_mod
from optwin.cli import main
from optwin.errors import CatalogError
from optwin.fingerprints.build import BuildConfig, build
from optwin.fingerprints.store import open_store


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[BuildConfig]:
    """Every check_inputs call (the CLI and build() both look it up on the module), still checking for real."""
    seen: list[BuildConfig] = []
    real = build_mod.check_inputs

    def counted(cfg: BuildConfig) -> None:
        seen.append(cfg)
        real(cfg)

    monkeypatch.setattr(build_mod, "check_inputs", counted)
    return seen


def test_cli_build_checks_its_inputs_once(tmp_path, calls) -> None:
    out = tmp_path / "fp.duckdb"
    with pytest.raises(SystemExit) as e:
        main(["build", "--ops", "geodesic", "--cases", "2", "--replays", "1", "--workers", "1", "--out", str(out)])
    assert e.value.code == 0
    assert len(calls) == 1
    with open_store(str(out), read_only=True) as store:
        assert store.latest_build_id() is not None  # the build ran to the end


def test_library_build_still_checks(tmp_path, calls) -> None:
    with pytest.raises(CatalogError, match="unknown operator 'foo'"):
        build(BuildConfig(out=str(tmp_path / "fp.duckdb"), ops=("foo",), cases=2))
    assert len(calls) == 1 and not (tmp_path / "fp.duckdb").exists()
