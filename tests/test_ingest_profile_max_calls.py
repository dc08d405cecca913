"""profile.json's "sampling" records max_calls, as capture()'s docstring says.

    python -m pytest -q tests/test_ingest_profile_max_calls.py

Without it a profile cut at max_calls looked like a whole capture: only the skipped counts hinted at it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from optwin.ingest import read_profile
from optwin.ingest.capture import capture
from optwin.ingest.profile import write_profile


def test_sampling_records_max_calls(tmp_path: Path) -> None:
    for cap, name in ((3, "cut"), (None, "whole")):
        with capture(sample_rate=1.0, capacity=8, seed=0, max_calls=cap) as rec:
            for _ in range(5):
                torch.softmax(torch.randn(2, 4), -1)
        write_profile(tmp_path / name, rec, model="m")
        meta = json.loads((tmp_path / name / "profile.json").read_text())
        assert "max_calls" in meta["sampling"] and meta["sampling"]["max_calls"] == cap
        assert read_profile(tmp_path / name).sketches.height == (cap or 5)
