"""optwin.validate.resketch: a collection that predates a sketch feature is completed from the same
seeded inputs; the scorer refuses an incomplete one with a one-line hint; foreign inputs are refused."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from optwin.errors import InputError, ProfileError
from optwin.validate.collect import collect, write_collected
from optwin.validate.resketch import resketch
from optwin.validate.score import read_collected


@pytest.fixture(scope="module")
def collected() -> dict:
    return collect("cpu", 4, seed=3, ops=["softmax", "attention"], trace_calls=3, progress=lambda m: None)


def _strip(data: dict, feature: str) -> dict:
    old = copy.deepcopy(data)
    for c in old["cases"]:
        c["sketch"].pop(feature, None)
    for t in old["traces"]:
        for c in t["calls"]:
            c["sketch"].pop(feature, None)
    return old


def test_missing_feature_is_restored_exactly(collected: dict) -> None:
    old = _strip(collected, "peaked_frac")
    done, added = resketch(old)
    assert added == {"peaked_frac"}
    assert done["resketched"]["features"] == ["peaked_frac"]
    for new, ref in zip(done["cases"], collected["cases"]):
        assert new["sketch"]["peaked_frac"] == pytest.approx(ref["sketch"]["peaked_frac"], abs=1e-12)
    assert any(c["sketch"]["peaked_frac"] > 0 for c in done["cases"])  # the check has teeth


def test_scorer_refuses_stale_collection_and_cli_fixes_it(collected: dict, tmp_path) -> None:
    stale = tmp_path / "stale.json"
    write_collected(_strip(collected, "peaked_frac"), stale)
    with pytest.raises(ProfileError, match="lack peaked_frac.*resketch"):
        read_collected(stale)
    fixed = tmp_path / "fixed.json"
    out = subprocess.run([sys.executable, "-m", "optwin.validate.resketch", str(stale), "--out", str(fixed)],
                         capture_output=True, text=True, check=True).stdout
    assert "added peaked_frac" in out
    assert read_collected(fixed)["resketched"]["device"] == "cpu"


def test_inputs_from_another_generator_are_refused(collected: dict) -> None:
    old = _strip(collected, "peaked_frac")
    old["cases"][0]["sketch"]["absmax"] *= 1.5
    with pytest.raises(InputError, match="do not match the collection"):
        resketch(old)


def test_unreadable_input_is_one_line_error(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cases": [{"op": "softmax"}]}))
    r = subprocess.run([sys.executable, "-m", "optwin.validate.resketch", str(bad), "--out", str(tmp_path / "o.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1


def test_redefined_feature_is_replaced_with_the_new_one() -> None:
    """A layernorm sketch from before const_absmax holds the old max_mean_over_std (the 1e30 cap for a
    constant row): resketch replaces it together with adding const_absmax, and leaves other features."""
    data = collect("cpu", 12, seed=5, ops=["layernorm"], trace_calls=0, progress=lambda m: None)
    old = _strip(data, "const_absmax")
    for c in old["cases"]:
        c["sketch"]["max_mean_over_std"] = 1e30  # what the old definition gave an input with a constant row
        c["sketch"]["rms"] = -1.0  # a feature resketch must keep as stored
    done, added = resketch(old)
    assert added == {"const_absmax", "max_mean_over_std"}
    for new, ref in zip(done["cases"], data["cases"]):
        assert new["sketch"]["max_mean_over_std"] == pytest.approx(ref["sketch"]["max_mean_over_std"], rel=1e-6)
        assert new["sketch"]["max_mean_over_std"] < 1e30
        assert new["sketch"]["const_absmax"] == pytest.approx(ref["sketch"]["const_absmax"], rel=1e-6)
        assert new["sketch"]["rms"] == -1.0
