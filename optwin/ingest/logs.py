"""Sketch logs from other systems (JSONL, CSV, Parquet), validated row by row.

    python -c "from optwin.ingest import read_sketch_log; print(read_sketch_log('calls.jsonl').rejected)"

Row schema (the sidecar's /v1/observe record, flattened or not):

* required: ``op`` (catalog operator), ``variant`` (one of the op's variants), ``dtype`` (one of
  the op's dtypes), and every sketch feature of the op (SKETCH_FEATURES[op]) as finite numbers,
  either as a nested ``sketch`` object (JSON; a JSON string in CSV/Parquet) or as flat fields;
* optional: ``stream`` (text, default ""), ``t`` (finite seconds, default null), ``call_index``
  (integer >= 0, default the row number), ``params`` (object or JSON text, default {}).

Bad rows are counted by reason, never raised: bad_json, not_an_object, missing_field,
unknown_op, unknown_variant, unsupported_dtype, bad_sketch, bad_time, bad_call_index, bad_params.
A missing or unreadable file (or an unknown extension) is a ProfileError.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from optwin.catalog import CATALOG
from optwin.errors import ProfileError, SketchError
from optwin.ingest.sketch import SKETCH_FEATURES, validate_sketch

if TYPE_CHECKING:
    import polars as pl

REASONS: tuple[str, ...] = ("bad_json", "not_an_object", "missing_field", "unknown_op", "unknown_variant",
                            "unsupported_dtype", "bad_sketch", "bad_time", "bad_call_index", "bad_params")
_NUMBER = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$|^\s*[-+]?(nan|inf|infinity)\s*$", re.I)


@dataclass
class SketchLog:
    """Accepted rows as a sketch table (same columns as a profile's), rejections by reason."""

    path: Path
    frame: "pl.DataFrame"
    n_rows: int
    rejected: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # first few "row N: reason: detail"

    @property
    def n_accepted(self) -> int:
        return self.frame.height

    def report(self) -> str:
        bad = ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items())) or "none"
        return f"{self.path}: {self.n_rows} rows, {self.n_accepted} accepted, rejected: {bad}"


class _Reject(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _cell(v: Any) -> Any:
    """CSV cells arrive as text: numbers become floats, empty cells None, other text stays text."""
    if isinstance(v, str):
        if v.strip() == "":
            return None
        if _NUMBER.match(v):
            return float(v)
    return v


def _as_obj(v: Any, what: str, reason: str) -> dict[str, Any]:
    if v is None:
        return {}
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            raise _Reject(reason, f"{what} is not valid JSON") from None
    if not isinstance(v, dict):
        raise _Reject(reason, f"{what} must be an object")
    return v


def validate_row(raw: Any, row_number: int) -> dict[str, Any]:
    """One raw row -> a clean row {op, variant, dtype, stream, call_index, t, params, sketch}."""
    if not isinstance(raw, dict):
        raise _Reject("not_an_object", f"expected an object, got {type(raw).__name__}")
    row = {k: _cell(v) for k, v in raw.items()}
    for k in ("op", "variant", "dtype"):
        if not isinstance(row.get(k), str) or not row[k]:
            raise _Reject("missing_field", f"{k} missing or not text")
    op = row["op"]
    spec = CATALOG.get(op)
    if spec is None:
        raise _Reject("unknown_op", f"unknown operator {op!r}")
    if row["variant"] not in spec.variant_names:
        raise _Reject("unknown_variant", f"{op}: unknown variant {row['variant']!r}")
    if row["dtype"] not in spec.dtypes:
        raise _Reject("unsupported_dtype", f"{op}: unsupported dtype {row['dtype']!r}")
    nested = row.get("sketch")
    if nested is not None:
        sk = _as_obj(nested, "sketch", "bad_sketch")
    else:
        sk = {f: row[f] for f in SKETCH_FEATURES[op] if row.get(f) is not None}
    try:
        sketch = validate_sketch(op, sk)
    except SketchError as e:
        raise _Reject("bad_sketch", str(e)) from None
    t = row.get("t")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)):
        raise _Reject("bad_time", f"t must be finite seconds, got {t!r:.40}")
    ci = row.get("call_index")
    if ci is None:
        ci = row_number
    elif isinstance(ci, bool) or not isinstance(ci, (int, float)) or not float(ci).is_integer() or ci < 0:
        raise _Reject("bad_call_index", f"call_index must be an integer >= 0, got {ci!r:.40}")
    params = _as_obj(row.get("params"), "params", "bad_params")
    stream = row.get("stream")
    return {"op": op, "variant": row["variant"], "dtype": row["dtype"],
            "stream": "" if stream is None else str(stream), "call_index": int(ci),
            "t": None if t is None else float(t), "params": params, "sketch": sketch}


def _jsonl_rows(path: Path) -> Iterator[Any]:
    with path.open("r", encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                yield _Reject("bad_json", f"not valid JSON ({e.msg})")


def _table_rows(path: Path, kind: str) -> Iterator[Any]:
    import polars as pl

    try:
        df = pl.read_csv(path, infer_schema=False) if kind == "csv" else pl.read_parquet(path)
    except Exception as e:  # noqa: BLE001  polars raises several classes for unreadable files
        raise ProfileError(f"{path}: unreadable {kind} ({type(e).__name__}: {str(e).splitlines()[0][:160]})") from None
    yield from df.iter_rows(named=True)


def read_sketch_log(path: str | Path, max_examples: int = 5) -> SketchLog:
    """Read a JSONL (.jsonl/.ndjson/.json), CSV (.csv) or Parquet (.parquet/.pq) sketch log."""
    from optwin.ingest.profile import sketch_frame

    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"no sketch log at {p}")
    ext = p.suffix.lower()
    if ext in (".jsonl", ".ndjson", ".json"):
        rows: Iterator[Any] = _jsonl_rows(p)
    elif ext in (".csv", ".parquet", ".pq"):
        rows = _table_rows(p, "csv" if ext == ".csv" else "parquet")
    else:
        raise ProfileError(f"{p}: unknown sketch log format {ext or '(no extension)'}; expected .jsonl, .csv or .parquet")
    good: list[dict[str, Any]] = []
    rejected: Counter[str] = Counter()
    examples: list[str] = []
    n = 0
    try:
        for n, raw in enumerate(rows, start=1):
            try:
                if isinstance(raw, _Reject):
                    raise raw
                good.append(validate_row(raw, n - 1))
            except _Reject as r:
                rejected[r.reason] += 1
                if len(examples) < max_examples:
                    examples.append(f"row {n}: {r.reason}: {r}")
    except OSError as e:
        raise ProfileError(f"{p}: read failed ({e})") from None
    return SketchLog(p, sketch_frame(good), n, rejected, examples)
