"""The Reproduce snippet of a case from a captured profile keeps the case's stored params.

    python -m pytest -x -q tests/test_dashboard_snippet_profile.py

Profile cases are not regenerated (their tensors live in the profile), but their params (causal attention,
a model's rope base) are stored with the case; a snippet on the defaults replays another computation.
"""

from __future__ import annotations

import json

import torch

from optwin import twin
from optwin.dashboard.snippet import reproduce_snippet
from optwin.ingest import default_sweep


def _profile_row(op: str, params: dict) -> dict:
    return {"case_id": 12345, "build_id": "b", "op": op, "variant": "torch", "dtype": "float32",
            "source": "profile-tensor", "family": "profile-tensor:x", "seed": 0, "case_index": 0, "shard": "s",
            "region": "r", "sketch": "{}", "params": json.dumps(params, sort_keys=True), "replays": 0, "noise": "none"}


def test_profile_snippet_passes_the_stored_params() -> None:
    case = default_sweep("attention", "float32", 1, 0)[0]  # a causal case: its inputs stand in for the profile's
    assert case.params == {"causal": True}
    row = _profile_row("attention", case.params)
    row["variant"] = "math"
    code = reproduce_snippet(row)
    assert code.count("inputs = ...") == 1
    ns: dict = {"captured": case.inputs}
    # the user loads the tensors from the profile; here they are the sweep case's
    exec(compile(code.replace("inputs = ...", "inputs = captured"), "<snippet>", "exec"), ns)
    assert ns["params"] == {"causal": True}
    want = twin.run("attention", "math", "float32", case.inputs, case.params)
    assert torch.equal(ns["res"].exact, want.exact)
    # the stored params matter here: unmasked attention is another output
    assert not torch.equal(twin.run("attention", "math", "float32", case.inputs, {}).exact, want.exact)


def test_profile_snippet_rope_base_and_missing_params() -> None:
    ns: dict = {}
    code = reproduce_snippet(_profile_row("rope", {"base": 500000.0}))
    exec(code.split("res = twin.run")[0].replace("inputs = ...", "inputs = None"), ns)
    assert ns["params"] == {"base": 500000.0}
    row = _profile_row("rope", {})
    row["params"] = None  # a row without params: the defaults, stated as {}
    ns = {}
    exec(reproduce_snippet(row).split("res = twin.run")[0].replace("inputs = ...", "inputs = None"), ns)
    assert ns["params"] == {}
