"""A build from a real captured profile (tiny Llama, random weights): captured tensors, fitted samples, sweeps.

    python -m pytest -q tests/test_build_profile.py
"""

from __future__ import annotations

import duckdb
import torch

from optwin.fingerprints.build import BuildConfig, build
from optwin.ingest.capture import capture
from optwin.ingest.models import default_texts, load_model


def test_profile_build_uses_captured_and_fitted_cases(tmp_path):
    torch.manual_seed(0)
    lm = load_model("llama-tiny-eager")
    with torch.no_grad(), capture(lm.module, sample_rate=1.0, capacity=2, seed=1, ops=("rmsnorm",)) as rec:
        for batch in lm.batches(default_texts(8), 8):
            lm.module(**batch)
    prof = rec.write_profile(tmp_path / "llama", model="llama-tiny-eager")
    out = str(tmp_path / "fp.duckdb")
    build(BuildConfig(out=out, profile=str(prof), ops=("rmsnorm", "geodesic"), cases=5, replays=2, seed=3, workers=2))
    with duckdb.connect(out, read_only=True) as c:
        sources = dict(c.execute("SELECT op || ':' || source, count(*) FROM cases GROUP BY ALL").fetchall())
        (profile,) = c.execute("SELECT profile FROM builds").fetchone()
        fams = {f for (f,) in c.execute("SELECT DISTINCT family FROM cases WHERE source LIKE 'profile%'").fetchall()}
    assert profile.endswith("llama")
    # rmsnorm was captured: captured tensors + fitted samples + boundary sweep; geodesic was not: default sweep
    assert {k for k in sources if k.startswith("rmsnorm")} == {"rmsnorm:profile-tensor", "rmsnorm:profile-sample", "rmsnorm:sweep"}
    assert {k for k in sources if k.startswith("geodesic")} == {"geodesic:default", "geodesic:sweep"}
    assert any(f.startswith("profile-tensor") for f in fams) and any(f.startswith("profile-sample") for f in fams)
