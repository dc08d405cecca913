"""A --seed the database cannot store is refused before any work, in one line.

    python -m pytest -q tests/test_build_seed_range.py

builds.seed is a BIGINT: a larger seed ran every shard, then failed the gather with a misleading "not a readable
fingerprint database ... Conversion Error: INT128 ... INT64".
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from optwin.errors import OptwinError
from optwin.fingerprints.build import SEED_MAX, SEED_MIN, BuildConfig, check_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("seed", ["99999999999999999999", "-99999999999999999999", str(2**63)])
def test_a_seed_outside_64_bits_is_one_error_line_before_any_work(tmp_path, seed):
    out = str(tmp_path / "fp.duckdb")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "optwin.fingerprints.cli", "build", "--ops", "geodesic", "--cases", "2",
                        "--seed", seed, "--out", out], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"error: --seed {seed} is out of range: the database stores it as a 64-bit integer " \
                               f"({-(2**63)} to {2**63 - 1})"
    assert not os.listdir(tmp_path)  # no work directory, lock or database


def test_the_64_bit_bounds_themselves_are_accepted(tmp_path):
    for seed in (SEED_MIN, SEED_MAX):
        check_inputs(BuildConfig(out=str(tmp_path / "fp.duckdb"), ops=("geodesic",), cases=2, seed=seed))
    with pytest.raises(OptwinError, match="out of range"):
        check_inputs(BuildConfig(out=str(tmp_path / "fp.duckdb"), ops=("geodesic",), cases=2, seed=SEED_MAX + 1))
