"""A small, real fingerprint database for the matcher/sidecar/monitor tests (schema v1, db_contract.md).

    python tests/_matcher_fixture.py /tmp/fp.duckdb

The schema comes from the store itself (`open_store(create=True)` runs the migrations); the rows are
written with SQL on the store's connection, column for column as the contract states:
- rmsnorm native-dtype / fp32-acc, float16: REAL twin runs (optwin.twin.run, stochastic noise,
  8 replays) over a log-uniform sweep of |x| from 2^-3 to 2^10, so the |x| = 256 boundary of
  native-dtype (x*x overflows float16) is where the twin puts it;
- rope low-precision-angles float16 and softmax naive float16: real sketches of real tensors, with
  outcomes drawn from a known probability curve (position precision lost above ~2^11; exp(x)
  overflows float16 above x = 11.09), for the stream tests until their twins exist.
Every 5th case is held out (held_out = true) and kept out of the fingerprints, for calibration.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import sys
from collections import defaultdict

import torch

from optwin import twin
from optwin.catalog import operator
from optwin.fingerprints.regions import region_features, region_key, region_of
from optwin.fingerprints.stats import wilson
from optwin.fingerprints.store import open_store
from optwin.ingest import sketch

REPLAYS = 8

# A healthy rmsnorm native-dtype float16 call's sketch: the sidecar tests' record payload.
RMS_SKETCH = {"numel": 256.0, "rows": 4.0, "absmax": 3.0, "rms": 1.0, "nonfinite": 0.0, "hidden": 64.0,
              "max_row_rms": 1.2, "weight_absmax": 1.0}


def rms_record(stream: str, t: float = 0.0, **kw) -> dict:
    """A sidecar record of RMS_SKETCH on `stream` at time t; kw adds or replaces fields."""
    return {"stream": stream, "op": "rmsnorm", "variant": "native-dtype", "dtype": "float16", "sketch": RMS_SKETCH,
            "t": t, **kw}


def _rmsnorm_case(g: torch.Generator, absmax: float, hidden: int) -> dict[str, torch.Tensor]:
    x = torch.randn(4, hidden, generator=g, dtype=torch.float64)  # (4, hidden)
    x = x / x.abs().max() * absmax
    return {"x": x.half(), "weight": torch.ones(hidden, dtype=torch.float16)}


def _rope_case(g: torch.Generator, max_pos: float) -> dict[str, torch.Tensor]:
    seq = 8
    pos = torch.linspace(max(0.0, max_pos - seq), max_pos, seq).round().long()  # (seq,)
    return {"x": torch.randn(seq, 2, 16, generator=g).half(), "positions": pos}


def _softmax_case(g: torch.Generator, top: float) -> dict[str, torch.Tensor]:
    x = torch.randn(4, 32, generator=g, dtype=torch.float64)  # (4, 32)
    x = x - x.max() + top
    return {"x": x.half()}


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def rope_true_p(sk: dict[str, float]) -> float:
    """The synthetic precision-loss curve of rope low-precision-angles float16 (positions)."""
    return _sigmoid(4.0 * (math.log2(1.0 + sk["max_pos"]) - 11.0))


def softmax_true_p(sk: dict[str, float]) -> float:
    """The synthetic nonfinite curve of softmax naive float16 (exp overflows above 11.09)."""
    return _sigmoid(6.0 * (sk["max"] - 11.09))


def twin_case(op: str, variant: str, dtype: str, inputs: dict[str, torch.Tensor], seed: int) -> dict:
    """One case from a real twin run (stochastic noise, REPLAYS replays): sketch, outcome counts."""
    r = twin.run(op, variant, dtype, inputs, noise="stochastic", replays=REPLAYS, seed=seed)
    counts = {ft: int(v.sum()) for ft, v in r.replay_faults.items()}
    return {"op": op, "variant": variant, "dtype": dtype, "params": {}, "sketch": sketch(op, inputs),
            "det": dict(r.faults), "counts": counts, "rel": float(r.rel_error)}


def generate_cases(seed: int = 0, n_rms: int = 140, n_syn: int = 140) -> list[dict]:
    """Cases with sketch, params and outcome counts, before aggregation."""
    torch.set_num_threads(1)  # tiny tensors: threads only contend
    g = torch.Generator().manual_seed(seed)
    rng = torch.Generator().manual_seed(seed + 1)
    out: list[dict] = []
    for variant in ("native-dtype", "fp32-acc"):
        for i in range(n_rms):
            absmax = 2.0 ** (-3.0 + 13.0 * float(torch.rand((), generator=g)))
            hidden = (64, 256)[i % 2]
            out.append(twin_case("rmsnorm", variant, "float16", _rmsnorm_case(g, absmax, hidden), seed + i))
    for i in range(n_syn):
        max_pos = 2.0 ** (4.0 + 12.0 * float(torch.rand((), generator=g)))
        sk = sketch("rope", _rope_case(g, max_pos))
        p = rope_true_p(sk)
        k = int(torch.binomial(torch.tensor(float(REPLAYS)), torch.tensor(p), generator=rng))
        out.append(dict(op="rope", variant="low-precision-angles", dtype="float16", params={"base": 10000.0},
                        sketch=sk, det={"nonfinite": False, "precision_loss": p > 0.5},
                        counts={"nonfinite": 0, "precision_loss": k}, rel=p * 1e-2))
    for i in range(n_syn):
        top = -4.0 + 24.0 * float(torch.rand((), generator=g))
        sk = sketch("softmax", _softmax_case(g, top))
        p = softmax_true_p(sk)
        k = int(torch.binomial(torch.tensor(float(REPLAYS)), torch.tensor(p), generator=rng))
        out.append(dict(op="softmax", variant="naive", dtype="float16", params={}, sketch=sk,
                        det={"nonfinite": p > 0.5, "precision_loss": False, "low_entropy": False},
                        counts={"nonfinite": k, "precision_loss": 0, "low_entropy": 0}, rel=0.0))
    return out


def write_db(path: str, seed: int = 0, build_id: str | None = None, cases: list[dict] | None = None,
             created_at: dt.datetime | None = None) -> str:
    """Write a one-build database at `path` (atomically: a temp file swapped in). Returns the build id."""
    cases = generate_cases(seed) if cases is None else cases
    bid = build_id or f"fixture-{seed}"
    tmp = f"{path}.tmp-{os.getpid()}"
    if os.path.exists(tmp):
        os.remove(tmp)
    store = open_store(tmp, read_only=False, create=True)
    c = store.conn
    agg: dict[tuple, dict] = defaultdict(lambda: {"n_cases": 0, "n_replays": 0, "n_faults": 0, "det_faults": 0,
                                                  "lo": {}, "hi": {}})
    for cid, case in enumerate(cases):
        op = case["op"]
        region = region_key(region_of(op, case["sketch"]))
        held = cid % 5 == 4
        c.execute("INSERT INTO cases VALUES (?, ?, ?, ?, ?, 'sweep', 'fixture', ?, ?, 'fixture', ?, ?, ?, ?)",
                  [bid, cid, op, case["variant"], case["dtype"], seed, cid, region, json.dumps(case["sketch"]),
                   json.dumps(case["params"]), held])
        fts = operator(op).fault_types
        det = case["det"]
        cnt = case["counts"]
        c.execute("INSERT INTO outcomes VALUES (?, ?, ?, 'stochastic', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  [bid, cid, REPLAYS, bool(det["nonfinite"]), bool(det["precision_loss"]),
                   bool(det["low_entropy"]) if "low_entropy" in fts else None,
                   cnt["nonfinite"], cnt["precision_loss"], cnt["low_entropy"] if "low_entropy" in fts else None,
                   case["rel"], case["rel"], case["rel"], case["rel"]])
        if held:
            continue
        for ft in fts:
            a = agg[(op, case["variant"], case["dtype"], region, ft)]
            a["n_cases"] += 1
            a["n_replays"] += REPLAYS
            a["n_faults"] += cnt[ft]
            a["det_faults"] += bool(det[ft])
            for f in region_features(op):
                v = case["sketch"][f]
                a["lo"][f] = min(a["lo"].get(f, v), v)
                a["hi"][f] = max(a["hi"].get(f, v), v)
    for (op, variant, dtype, region, ft), a in sorted(agg.items()):
        lo, hi = wilson(a["n_faults"], a["n_replays"], n_eff=a["n_cases"])
        c.execute("INSERT INTO fingerprints VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
                  [bid, op, variant, dtype, region, ft, a["n_cases"], a["n_replays"], a["n_faults"],
                   a["n_faults"] / a["n_replays"], lo, hi, json.dumps(a["lo"]), json.dumps(a["hi"]), a["det_faults"]])
    created = created_at or dt.datetime.now()
    # the replays above ran this optwin's twins: their version, so the matcher has no mismatch to warn of
    c.execute("INSERT INTO builds VALUES (?, ?, 'test', ?, ?, ?, NULL, ?, 'stochastic', 'local', ?, ?, 0.0)",
              [bid, created, twin.TWIN_VERSION, seed, json.dumps({"fixture": True}), REPLAYS, len(cases), len(cases) * REPLAYS])
    store.checkpoint()
    store.close()
    os.replace(tmp, path)
    return bid


def cached_db(dst: str | None = None, seed: int = 0) -> str:
    """The fixture database, generated once per machine (keyed by this file's text), copied to `dst`.

    Generation runs ~1300 twin replays; every test module of the matcher area shares one result.
    """
    import hashlib
    import shutil
    import tempfile

    with open(__file__, "rb") as f:
        # The regions depend on the catalog's region features and the bin grid: key on them too, or
        # a cache written under an older grid would load with every region skipped.
        from optwin.catalog import CATALOG
        from optwin.fingerprints.regions import _BINNING

        from optwin.fingerprints.migrations import SCHEMA_VERSION

        # and on the twins' version, which the build row records (a cache from older twins would warn)
        grid = repr(([(o.name, o.region_features) for o in CATALOG.values()], sorted(_BINNING.items()), SCHEMA_VERSION,
                     twin.TWIN_VERSION))
        key = hashlib.sha256(f.read() + str(seed).encode() + grid.encode()).hexdigest()[:16]
    cache = os.path.join(tempfile.gettempdir(), f"optwin-matcher-fixture-{key}.duckdb")
    if not os.path.exists(cache):
        write_db(cache, seed=seed)  # atomic (temp file + os.replace): concurrent sessions are safe
    if dst is None:
        return cache
    shutil.copyfile(cache, dst)
    return dst


if __name__ == "__main__":
    print(write_db(sys.argv[1]))
