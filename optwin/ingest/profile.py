"""Input profiles on disk: write a capture, read it back, with one-line errors for bad files.

    python -c "from optwin.ingest import read_profile; p = read_profile('profiles/minilm'); print(p.summary())"

A profile is a directory:

* ``profile.json``: format tag and version, model, creation time, library versions, the
  capture's sampling settings, call and sample counts, skipped calls by reason. Written last, so
  a directory without it is an interrupted write.
* ``sketches.parquet`` (polars): one row per call: op, variant, dtype, stream, call_index (int64),
  t (float64 seconds since the capture began), params (JSON text) and one float64 column per
  sketch feature (the union over ops; null where a feature is not the op's).
* ``tensors.safetensors`` + ``tensors_index.json``: the reservoir-sampled raw inputs. The index
  lists each sample (op, variant, dtype, stream, call_index, shape_class, params) and the
  safetensors key of each of its inputs ("s<id>/<input name>"). No pickle anywhere.

Missing, truncated or corrupt files raise `ProfileError` with one line naming the file.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import torch

from optwin.catalog import CATALOG
from optwin.errors import ProfileError
from optwin.ingest.generate import Case
from optwin.ingest.sketch import SKETCH_FEATURES

if TYPE_CHECKING:
    import polars as pl

    from optwin.ingest.capture import Recorder

FORMAT = "optwin-profile"
FORMAT_VERSION = 1
META_FILE, SKETCH_FILE, TENSOR_FILE, INDEX_FILE = "profile.json", "sketches.parquet", "tensors.safetensors", "tensors_index.json"

# Every feature name of every op, in first-seen order: the feature columns of a sketch table.
ALL_FEATURES: tuple[str, ...] = tuple(dict.fromkeys(f for op in CATALOG for f in SKETCH_FEATURES[op]))
BASE_COLUMNS: tuple[str, ...] = ("op", "variant", "dtype", "stream", "call_index", "t", "params")


def sketch_frame(rows: Iterable[dict[str, Any]]) -> "pl.DataFrame":
    """Rows {op, variant, dtype, stream, call_index, t, params, sketch} -> the sketch table."""
    import polars as pl

    cols: dict[str, list[Any]] = {c: [] for c in BASE_COLUMNS + ALL_FEATURES}
    for r in rows:
        for c in ("op", "variant", "dtype", "stream"):
            cols[c].append(str(r.get(c, "")))
        cols["call_index"].append(int(r["call_index"]))
        t = r.get("t")
        cols["t"].append(float(t) if t is not None else None)
        cols["params"].append(json.dumps(r.get("params") or {}, sort_keys=True))
        sk = r["sketch"]
        for f in ALL_FEATURES:
            cols[f].append(sk.get(f))
    schema = {c: pl.Utf8 for c in ("op", "variant", "dtype", "stream", "params")}
    schema.update({"call_index": pl.Int64, "t": pl.Float64})
    schema.update({f: pl.Float64 for f in ALL_FEATURES})
    return pl.DataFrame(cols, schema=schema).select(list(BASE_COLUMNS + ALL_FEATURES))


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "polars", "safetensors"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001  versions are informational
            pass
    try:
        from importlib.metadata import version

        out["optwin"] = version("optwin")
    except Exception:  # noqa: BLE001
        out["optwin"] = "dev"
    return out


def write_profile(path: str | Path, rec: "Recorder", model: str = "", extra: dict[str, Any] | None = None) -> Path:
    """Write a Recorder's calls and samples as a profile directory (created if needed)."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / META_FILE).unlink(missing_ok=True)  # profile.json is the completion marker: drop it first
    records = rec.records()
    sketch_frame(records).write_parquet(out / SKETCH_FILE)
    tensors: dict[str, torch.Tensor] = {}
    index: list[dict[str, Any]] = []
    for i, s in enumerate(rec.all_samples()):
        keys = {}
        for name, t in s.inputs.items():
            keys[name] = f"s{i}/{name}"
            tensors[keys[name]] = t
        index.append({"id": i, "op": s.op, "variant": s.variant, "dtype": s.dtype, "stream": s.stream,
                      "call_index": s.call_index, "shape_class": s.shape_class, "params": s.params, "tensors": keys})
    save_file(tensors, str(out / TENSOR_FILE), metadata={"format": FORMAT})
    (out / INDEX_FILE).write_text(json.dumps({"version": FORMAT_VERSION, "samples": index}, indent=1))
    st = rec.settings
    meta = {
        "format": FORMAT, "version": FORMAT_VERSION, "model": model,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rec.started)),
        "versions": _versions(),
        "sampling": {"sample_rate": st.sample_rate, "capacity": st.capacity, "seed": st.seed,
                     "ops": list(st.ops) if st.ops is not None else None},
        "n_calls": len(records), "n_samples": len(index), "skipped": dict(rec.skipped),
        **(extra or {}),
    }
    tmp = out / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1, default=str))
    os.replace(tmp, out / META_FILE)
    return out


@dataclass
class Profile:
    """A profile read from disk. `sketches` is the polars sketch table; samples load lazily."""

    path: Path
    meta: dict[str, Any]
    sketches: "pl.DataFrame"
    index: list[dict[str, Any]] = field(default_factory=list)

    def ops(self) -> list[str]:
        return sorted(set(self.sketches["op"].to_list()))

    def triples(self) -> list[tuple[str, str, str]]:
        """Distinct (op, variant, dtype) captured."""
        rows = self.sketches.select("op", "variant", "dtype").unique().rows()
        return sorted((str(a), str(b), str(c)) for a, b, c in rows)

    def streams(self, op: str | None = None) -> list[str]:
        df = self.sketches if op is None else self.sketches.filter(self.sketches["op"] == op)
        return sorted(set(df["stream"].to_list()))

    def features(self, op: str, variant: str | None = None, dtype: str | None = None) -> "pl.DataFrame":
        """The op's rows (optionally one variant/dtype) with only the op's feature columns."""
        import polars as pl

        cond = pl.col("op") == op
        if variant is not None:
            cond &= pl.col("variant") == variant
        if dtype is not None:
            cond &= pl.col("dtype") == dtype
        return self.sketches.filter(cond).select(list(SKETCH_FEATURES[op]))

    def sample(self, i: int) -> Case:
        """Raw inputs of sample i as a Case (family "profile-tensor:<stream>")."""
        from safetensors import SafetensorError, safe_open

        entry = self.index[i]
        try:
            with safe_open(str(self.path / TENSOR_FILE), framework="pt") as f:
                inputs = {name: f.get_tensor(key) for name, key in entry["tensors"].items()}
        except (SafetensorError, OSError) as e:
            raise ProfileError(f"{self.path / TENSOR_FILE}: cannot read sample {i}: {str(e).splitlines()[0]}") from None
        return Case(inputs, dict(entry.get("params") or {}), f"profile-tensor:{entry.get('stream', '')}")

    def samples(self, op: str | None = None, variant: str | None = None, dtype: str | None = None) -> list[Case]:
        return [self.sample(i) for i, e in enumerate(self.index)
                if (op is None or e["op"] == op) and (variant is None or e["variant"] == variant)
                and (dtype is None or e["dtype"] == dtype)]

    def summary(self) -> dict[str, Any]:
        return {"model": self.meta.get("model"), "calls": self.sketches.height, "samples": len(self.index),
                "triples": self.triples(), "streams": len(self.streams())}


def _fail(path: Path, why: str) -> ProfileError:
    return ProfileError(f"{path}: {why}")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise _fail(path, "missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(path, f"not valid JSON ({str(e).splitlines()[0]})") from None


def read_profile(path: str | Path) -> Profile:
    """Read and check a profile directory; ProfileError (one line) when anything is missing or corrupt."""
    import polars as pl

    root = Path(path)
    if not root.is_dir():
        raise ProfileError(f"no profile directory at {root}: run `optwin capture --out {root}`")
    meta = _read_json(root / META_FILE)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _fail(root / META_FILE, f"not an optwin profile (format {meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version") != FORMAT_VERSION:
        raise _fail(root / META_FILE, f"profile format version {meta.get('version')!r}; this optwin reads {FORMAT_VERSION}")
    sk_path = root / SKETCH_FILE
    if not sk_path.is_file():
        raise _fail(sk_path, "missing")
    try:
        df = pl.read_parquet(sk_path)
    except Exception as e:  # noqa: BLE001  polars/arrow raise several classes for corrupt files
        raise _fail(sk_path, f"corrupt or truncated parquet ({type(e).__name__}: {str(e).splitlines()[0][:160]})") from None
    missing = [c for c in BASE_COLUMNS + ALL_FEATURES if c not in df.columns]
    if missing:
        raise _fail(sk_path, f"missing columns {', '.join(missing)} (written by an older optwin whose sketch "
                             "lacked them: capture the profile again)")
    n_calls = meta.get("n_calls")
    if isinstance(n_calls, int) and n_calls != df.height:
        raise _fail(sk_path, f"holds {df.height} rows but profile.json says {n_calls} calls (truncated?)")
    unknown = sorted(set(df["op"].to_list()) - set(CATALOG))
    if unknown:
        raise _fail(sk_path, f"unknown operators {', '.join(map(str, unknown))}")
    index = _read_index(root)
    return Profile(root, meta, df, index)


def _read_index(root: Path) -> list[dict[str, Any]]:
    from safetensors import SafetensorError, safe_open

    t_path, i_path = root / TENSOR_FILE, root / INDEX_FILE
    if not t_path.exists() and not i_path.exists():
        return []
    idx = _read_json(i_path)
    if not isinstance(idx, dict) or not isinstance(idx.get("samples"), list):
        raise _fail(i_path, "expected an object with a 'samples' list")
    if not t_path.is_file():
        raise _fail(t_path, "missing (the index lists samples)")
    try:
        with safe_open(str(t_path), framework="pt") as f:
            keys = set(f.keys())
            shapes = {k: f.get_slice(k).get_shape() for k in keys}
    except (SafetensorError, OSError, ValueError) as e:
        raise _fail(t_path, f"corrupt or truncated safetensors ({str(e).splitlines()[0][:160]})") from None
    for s in idx["samples"]:  # each entry's form first: the tensor lookups below index into it
        t = s.get("tensors") if isinstance(s, dict) else None
        if (not isinstance(s, dict) or s.get("op") not in CATALOG or not isinstance(t, dict)
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in t.items())
                or not isinstance(s.get("params") or {}, dict)):
            raise _fail(i_path, f"malformed sample entry {str(s)[:80]}")
    need = {k for s in idx["samples"] for k in s["tensors"].values()}
    absent = sorted(need - keys)
    if absent:
        raise _fail(t_path, f"missing tensors {', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''}")
    for s in idx["samples"]:
        if any(math.prod(shapes[k]) < 0 for k in s["tensors"].values()):
            raise _fail(t_path, "negative shape")
    return idx["samples"]
