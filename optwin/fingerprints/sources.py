"""Where a build's cases come from: the ingest generators and input profiles, by source name.

    python -c "from optwin.fingerprints.sources import generate; print(len(generate('default', 'rmsnorm', 'float16', 8, 0)))"

Sources (the `cases.source` column):
- `default`: optwin.ingest.default_sweep(op, dtype, n_cases, seed): the op's feature space;
- `sweep`: optwin.ingest.boundary_sweep(op, dtype, n_cases, seed): dense around fault boundaries;
- `profile-tensor`: tensors captured from a model (optwin.ingest.read_profile);
- `profile-sample`: optwin.ingest.sample_inputs(op, dtype, fitted, n_cases, seed) from the profile's fit.
Every source is a deterministic function of (op, dtype, n_cases, seed[, profile]): a case is
reproduced from its row's (source, seed, case_index). Generators are the ingest engineer's; this module
only adapts them (and casts captured tensors to the variant's dtype).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

from optwin.catalog import operator
from optwin.errors import ProfileError

SOURCES = ("default", "sweep", "profile-tensor", "profile-sample")


@dataclass
class GenCase:
    """One generated case: what twin.run needs plus its provenance inside the generator call."""

    inputs: dict[str, torch.Tensor]
    params: dict[str, Any]
    family: str
    case_index: int


def _to_dtype(op: str, dtype: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Cast floating 'op'-dtype inputs to the variant's dtype (captured tensors come in the model's)."""
    from optwin.validation import torch_dtype

    specs = {i.name: i for i in operator(op).inputs}
    out = {}
    for name, t in inputs.items():
        spec = specs.get(name)
        want = torch_dtype(dtype if spec is None or spec.dtype == "op" else spec.dtype)
        out[name] = t.to(want) if t.dtype != want else t
    return out


def _wrap(op: str, dtype: str, cases: list[Any]) -> list[GenCase]:
    out = []
    for i, c in enumerate(cases):
        inputs = dict(getattr(c, "inputs"))
        out.append(GenCase(_to_dtype(op, dtype, inputs), dict(getattr(c, "params", None) or {}),
                           str(getattr(c, "family", "") or "unknown"), i))
    return out


@functools.lru_cache(maxsize=2)
def _profile(path: str) -> Any:
    import optwin.ingest as ingest

    if not os.path.exists(path):
        raise ProfileError(f"no profile at {path}: run `optwin capture` first")
    return ingest.read_profile(path)


def profile_ops(path: str) -> set[str]:
    """The operators a profile holds captured calls of."""
    prof = _profile(path)
    ops = getattr(prof, "ops", None)
    ops = ops() if callable(ops) else ops
    if ops is None:
        raise ProfileError(f"{path}: profile lists no operators")
    return set(ops)


def check_profile_sketches(path: str, ops: set[str] | tuple[str, ...]) -> None:
    """ProfileError naming the profile, op and column when a sketch feature of one of `ops` holds NaN or inf:
    sketches are finite by construction (optwin.ingest.sketch), so such a file is damaged, and the build would
    otherwise fail mid-way fitting it, without naming the file. Nulls (features not the op's) are fine."""
    import polars as pl

    from optwin.ingest import SKETCH_FEATURES

    df = _profile(path).sketches
    for op in sorted(set(ops)):
        rows = df.filter(pl.col("op") == op)
        for col in SKETCH_FEATURES.get(op, ()):
            if col not in rows.columns or not rows[col].dtype.is_float():
                continue
            bad = int((rows[col].is_nan() | rows[col].is_infinite()).sum())
            if bad:
                raise ProfileError(f"{path}: sketch column {col!r} of {op} holds NaN or inf in {bad} of {rows.height} "
                                   "calls (sketches.parquet is damaged): capture the profile again")


def _profile_tensors(path: str, op: str, dtype: str, n_cases: int) -> list[GenCase]:
    """Captured inputs of `op`: those captured in `dtype` when there are any, else all (cast)."""
    prof = _profile(path)
    cases = prof.samples(op=op, dtype=dtype) or prof.samples(op=op)
    return _wrap(op, dtype, cases[:n_cases])


@functools.lru_cache(maxsize=2)
def _fitted(path: str) -> Any:
    import optwin.ingest as ingest

    try:
        fit_profile = ingest.fit_profile
    except ImportError:  # optwin.ingest.fit not available: no fitted samples
        return None
    return fit_profile(_profile(path))


def _profile_samples(path: str, op: str, dtype: str, n_cases: int, seed: int) -> list[GenCase]:
    """Inputs sampled from the profile's fitted feature distributions (none when it cannot be fitted)."""
    import optwin.ingest as ingest

    fitted = _fitted(path)
    if fitted is None or not fitted.for_op(op, dtype):  # the profile holds no calls of op
        return []
    return _wrap(op, dtype, ingest.sample_inputs(op, dtype, fitted, n_cases, seed))


@functools.lru_cache(maxsize=2)
def generate(source: str, op: str, dtype: str, n_cases: int, seed: int, profile: str | None = None) -> list[GenCase]:
    """All cases of one generator call (cached: the slices and variants of a shard family share it)."""
    import optwin.ingest as ingest

    if source in ("default", "sweep"):
        gen = ingest.default_sweep if source == "default" else ingest.boundary_sweep
        return _wrap(op, dtype, gen(op, dtype, n_cases, seed))
    if source == "profile-tensor":
        return _profile_tensors(_need(profile), op, dtype, n_cases)
    if source == "profile-sample":
        return _profile_samples(_need(profile), op, dtype, n_cases, seed)
    raise ValueError(f"unknown case source {source!r}; expected one of {', '.join(SOURCES)}")


def _need(profile: str | None) -> str:
    if profile is None:
        raise ProfileError("a profile source needs --profile")
    return profile

