"""One unit of build work: a shard (op, variant, dtype, source, slice) replayed through its twin.

    python -c "from optwin.fingerprints.shards import ShardSpec, run_shard; print(run_shard(ShardSpec('rmsnorm', 'native-dtype', 'float16', 'default', 0, 1, 8, 1, 4, 'stochastic', 0).to_dict(), '/tmp/w'))"

`run_shard` is a plain top-level function of plain arguments, so the local process pool and Ray
tasks run exactly the same code. It writes one Parquet file per shard (one row per case: the
`cases` and `outcomes` columns of the database plus f0..f3, the region feature values) to a temporary
name, fsyncs it and os.replace()s it into place: a shard file either exists complete or not at all, which is
what `--resume` relies on (and checks: `shard_done`). A small JSON summary (counts, rejections, timing) is written
first, the same way.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from optwin.fingerprints.aggregate import N_FEATURE_COLUMNS

# Column order and DuckDB types of a shard file (also the staging table the store gathers into).
SHARD_SCHEMA_SQL: tuple[tuple[str, str], ...] = (
    ("case_id", "BIGINT"), ("op", "VARCHAR"), ("variant", "VARCHAR"), ("dtype", "VARCHAR"),
    ("source", "VARCHAR"), ("family", "VARCHAR"), ("seed", "BIGINT"), ("case_index", "INTEGER"),
    ("shard", "VARCHAR"), ("region", "VARCHAR"), ("sketch", "VARCHAR"), ("params", "VARCHAR"),
    ("held_out", "BOOLEAN"), ("replays", "INTEGER"), ("noise", "VARCHAR"),
    ("det_nonfinite", "BOOLEAN"), ("det_precision_loss", "BOOLEAN"), ("det_low_entropy", "BOOLEAN"),
    ("n_nonfinite", "INTEGER"), ("n_precision_loss", "INTEGER"), ("n_low_entropy", "INTEGER"),
    ("det_rel_error", "DOUBLE"), ("err_q50", "DOUBLE"), ("err_q90", "DOUBLE"), ("err_max", "DOUBLE"),
) + tuple((f"f{i}", "DOUBLE") for i in range(N_FEATURE_COLUMNS))

HELD_OUT_PERCENT = 20


def stable_hash(*parts: Any) -> int:
    """A 63-bit non-negative hash of the parts' text, the same in every process and Python version."""
    h = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") >> 1


def is_held_out(op: str, dtype: str, source: str, gen_seed: int, case_index: int) -> bool:
    """~20% of inputs, chosen by a hash of the case's identity. The variant is left out of the hash on
    purpose: the same input is held out for every variant, so calibration compares like with like."""
    return stable_hash("held-out", op, dtype, source, gen_seed, case_index) % 100 < HELD_OUT_PERCENT


@dataclass(frozen=True)
class ShardSpec:
    op: str
    variant: str
    dtype: str
    source: str
    slice_index: int  # this shard takes cases[slice_index::n_slices] of the generator call
    n_slices: int
    n_cases: int  # cases in the whole generator call
    gen_seed: int  # seed of the generator call (cases.seed)
    replays: int
    noise: str
    build_seed: int
    profile: str | None = None
    tolerances: dict[str, float] = field(default_factory=dict)  # Tolerances overrides

    @property
    def shard_id(self) -> str:
        return f"{self.op}.{self.variant}.{self.dtype}.{self.source}.{self.slice_index:03d}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shard_path(work_dir: str, shard_id: str) -> str:
    return os.path.join(work_dir, "shards", f"{shard_id}.parquet")


def summary_path(work_dir: str, shard_id: str) -> str:
    return os.path.join(work_dir, "shards", f"{shard_id}.summary.json")


def _quantiles(errs: list[float]) -> tuple[float, float, float]:
    """(q50, q90, max) as observed values (inverted CDF: no interpolation between inf and finite)."""
    s = sorted(errs)
    n = len(s)
    pick = lambda q: s[max(0, math.ceil(q * n) - 1)]  # noqa: E731
    return pick(0.5), pick(0.9), s[-1]


def _case_row(spec: ShardSpec, case: Any, tol: Any) -> dict[str, Any]:
    """Sketch, region and twin outcome of one case (raises OptwinError on an unusable case)."""
    import torch

    from optwin import twin
    from optwin.fingerprints.regions import region_key, region_of, region_values
    from optwin.ingest import sketch

    sk = sketch(spec.op, case.inputs, case.params)
    case_id = stable_hash("case", spec.build_seed, spec.op, spec.variant, spec.dtype, spec.source, spec.gen_seed,
                          case.case_index)
    res = twin.run(spec.op, spec.variant, spec.dtype, case.inputs, case.params, noise=spec.noise,
                   replays=spec.replays, seed=case_id % (2**31), tolerances=tol)
    det = res.faults
    det_err = float(res.rel_error) if not math.isnan(res.rel_error) else math.inf
    row: dict[str, Any] = {
        "case_id": case_id, "op": spec.op, "variant": spec.variant, "dtype": spec.dtype,
        "source": spec.source, "family": case.family, "seed": spec.gen_seed, "case_index": case.case_index,
        "shard": spec.shard_id, "region": region_key(region_of(spec.op, sk)),
        "sketch": json.dumps({k: float(v) for k, v in sk.items()}),
        "params": json.dumps(case.params, default=_jsonable, sort_keys=True),
        "held_out": is_held_out(spec.op, spec.dtype, spec.source, spec.gen_seed, case.case_index),
        "replays": spec.replays, "noise": spec.noise, "det_rel_error": det_err,
    }
    for fault in ("nonfinite", "precision_loss", "low_entropy"):
        if fault not in det:
            row[f"det_{fault}"], row[f"n_{fault}"] = None, None
            continue
        row[f"det_{fault}"] = bool(det[fault])
        row[f"n_{fault}"] = int(res.replay_faults[fault].sum()) if spec.replays else int(det[fault])
    if spec.replays:
        errs = torch.nan_to_num(res.replay_rel_error.double(), nan=math.inf).tolist()  # NaN output: total loss
        row["err_q50"], row["err_q90"], row["err_max"] = _quantiles(errs)
    else:
        row["err_q50"] = row["err_q90"] = row["err_max"] = det_err
    values = region_values(spec.op, sk)
    for i in range(N_FEATURE_COLUMNS):
        row[f"f{i}"] = values[i] if i < len(values) else None
    return row


def _jsonable(v: Any) -> Any:
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def _write_atomic(path: str, write) -> None:
    """Write `path` through a temporary file: fsynced before the rename, so a crash (power loss, a node going down)
    cannot leave an empty or partial file under the final name (without the fsync, ext4 and others may commit the
    rename before the data), and the directory fsynced after it, so the rename itself survives. The temporary name
    is unique per call: the pid is not (Ray workers on several nodes, a pid reused after a kill)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
        try:
            _fsync(os.path.dirname(path))
        except OSError as e:
            # Some filesystems (FUSE, some network ones, where Ray work dirs live) refuse to fsync a directory; the
            # rename is done by then, and failing every shard over it would leave no build at all.
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_SUMMARY_KEYS = ("shard", "op", "variant", "dtype", "cases", "replays", "rejected", "faults")


def shard_done(work_dir: str, shard_id: str) -> bool:
    """True if the shard's summary and Parquet file are both there and readable: the summary a JSON object with
    its keys, the Parquet file's footer readable with the summary's row count and the shard columns. A --resume
    trusts only such a pair; a damaged one would fail the gather (or the summary read) on every --resume."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with open(summary_path(work_dir, shard_id)) as f:
            summary = json.load(f)
        meta = pq.read_metadata(shard_path(work_dir, shard_id))
    except (OSError, ValueError, pa.ArrowException):
        return False
    if not isinstance(summary, dict) or any(k not in summary for k in _SUMMARY_KEYS):
        return False
    return meta.num_rows == summary["cases"] and {c for c, _ in SHARD_SCHEMA_SQL} <= set(meta.schema.names)


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def run_shard(spec_dict: dict[str, Any], work_dir: str) -> dict[str, Any]:
    """Run one shard and write its Parquet file; returns its summary (also written as JSON).

    Unusable cases (the sketch or twin raises an OptwinError) are counted by reason, not fatal.
    """
    import polars as pl

    from optwin.catalog import resolve_tolerances
    from optwin.errors import OptwinError
    from optwin.fingerprints.sources import generate

    t0, c0 = time.perf_counter(), time.process_time()
    spec = ShardSpec(**spec_dict)
    tol = resolve_tolerances(spec.tolerances)  # once a shard, not in every case's twin.run
    cases = generate(spec.source, spec.op, spec.dtype, spec.n_cases, spec.gen_seed, spec.profile)
    rows, rejected = [], Counter()
    for case in cases[spec.slice_index::spec.n_slices]:
        try:
            rows.append(_case_row(spec, case, tol))
        except OptwinError as e:
            rejected[type(e).__name__] += 1
    schema = polars_schema()
    df = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    faults = {f: int(df[f"n_{f}"].sum() or 0) for f in ("nonfinite", "precision_loss", "low_entropy")}
    summary = {"shard": spec.shard_id, "op": spec.op, "variant": spec.variant, "dtype": spec.dtype,
               "cases": len(rows), "replays": len(rows) * spec.replays, "rejected": dict(rejected),
               "faults": faults, "seconds": time.perf_counter() - t0,
               "cpu_s": time.process_time() - c0}
    os.makedirs(os.path.join(work_dir, "shards"), exist_ok=True)
    _write_atomic(summary_path(work_dir, spec.shard_id), lambda p: _write_text(p, json.dumps(summary)))
    # The Parquet file is the shard's commit marker: written last, complete or absent.
    _write_atomic(shard_path(work_dir, spec.shard_id), lambda p: df.write_parquet(p))
    return summary


def polars_schema() -> dict[str, Any]:
    """SHARD_SCHEMA_SQL as a polars schema (polars loads lazily: workers only)."""
    import polars as pl

    types = {"BIGINT": pl.Int64, "INTEGER": pl.Int32, "VARCHAR": pl.Utf8, "BOOLEAN": pl.Boolean, "DOUBLE": pl.Float64}
    return {c: types[t] for c, t in SHARD_SCHEMA_SQL}
