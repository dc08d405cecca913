"""The sketch buffer our Triton kernels write, and its reduction to the sketch contract's features.

    python -c "from optwin.kernels.sketch_buffer import LAYOUTS; print(LAYOUTS['softmax'])"

Each kernel program handles one row and writes that row's partials (float32) into row `r` of a small
buffer of shape (rows [+ 1], C); programs never meet, so there is no atomic and no zero-fill launch.
Ops with parameter vectors (weight, bias) get one extra last row that program 0 fills with the
parameters' partials. The second, tiny step (`reduce_sketch`, a handful of torch reductions over
rows x C floats, in float64) turns partials into the contract's features without a host sync;
`read_sketch` does that and one `.tolist()`.

Definitions follow optwin.ingest.sketch exactly (magnitudes over finite elements, counts of
non-finite values; softmax's -inf is a mask, not a non-finite), except that the per-row partials are
accumulated in float32 by the kernel where ingest uses float64: features agree to float32 rounding
(relative ~1e-6 for sums of squares, more for |mean|/std near cancellation). Pure torch, no triton.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from optwin.catalog import operator, resolve_params
from optwin.errors import InputError

# Stand-in for +inf in max_mean_over_std (std == 0, mean != 0); the same cap as optwin.ingest.
RATIO_CAP = 1e30

# Column layout per op: names of the per-row partials, and of the parameter row (if any).
# Kernels index columns by position in these tuples (C_* constants below), so the layout lives here once.
LAYOUTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # row: largest finite |x|, sum of finite x^2, count of NaN/±inf
    "rmsnorm": (("absmax", "sumsq", "nonfinite"), ("weight_absmax", "weight_nonfinite")),
    # row: + largest and smallest finite x (signed; -inf/+inf when the row has none), count of -inf
    "softmax": (("absmax", "sumsq", "nonfinite", "max", "min", "neginf"), ()),
    # row: + mean and population std over the row's finite entries (two-pass, float32)
    "layernorm": (
        ("absmax", "sumsq", "nonfinite", "mean", "std"),
        ("weight_absmax", "bias_absmax", "param_nonfinite"),
    ),
    # row = one sequence position (all heads): + |position|
    "rope": (("absmax", "sumsq", "nonfinite", "abspos"), ()),
}


def n_cols(op: str) -> int:
    """Columns of `op`'s buffer: enough for the row partials and the parameter row."""
    row, par = LAYOUTS[op]
    return max(len(row), len(par))


def n_rows(op: str, rows: int) -> int:
    """Rows of `op`'s buffer for `rows` kernel rows (one extra for the parameter row)."""
    return rows + (1 if LAYOUTS[op][1] else 0)


def new_buffer(op: str, rows: int, device: torch.device | str) -> torch.Tensor:
    """Uninitialised float32 (rows [+1], C): every entry is written by the kernel."""
    return torch.empty(n_rows(op, rows), n_cols(op), dtype=torch.float32, device=device)


def _col(buf: torch.Tensor, op: str, name: str) -> torch.Tensor:
    """Column `name` of the row partials as float64, shape (rows,)."""
    row, par = LAYOUTS[op]
    body = buf[:-1] if par else buf
    return body[:, row.index(name)].to(torch.float64)


def _par(buf: torch.Tensor, op: str, name: str) -> torch.Tensor:
    return buf[-1, LAYOUTS[op][1].index(name)].to(torch.float64)


def _amax0(t: torch.Tensor) -> torch.Tensor:
    """amax with 0 for an empty tensor (the contract: empty input -> 0 magnitudes)."""
    return t.amax() if t.numel() else t.new_zeros(())


def _features(op: str, buf: torch.Tensor, shape: Sequence[int], params: dict[str, Any]) -> dict[str, Any]:
    """Contract features from the buffer; values are float64 0-dim tensors or Python floats."""
    n = int(shape[-1]) if len(shape) else 1
    numel = math.prod(shape)
    absmax, sumsq, nonfin = _col(buf, op, "absmax"), _col(buf, op, "sumsq"), _col(buf, op, "nonfinite")
    out: dict[str, Any] = {"numel": float(numel), "rows": float(math.prod(shape[:-1]))}
    out["absmax"] = _amax0(absmax)
    finite_count = numel - nonfin.sum()
    if op == "softmax":
        neginf = _col(buf, op, "neginf")
        finite_count = finite_count - neginf.sum()
    out["rms"] = torch.sqrt(sumsq.sum() / finite_count.clamp(min=1))
    out["nonfinite"] = nonfin.sum()

    if op == "rmsnorm":
        row_cnt = (n - nonfin).clamp(min=1)  # (rows,) finite entries per row
        out["hidden"] = float(n)
        out["max_row_rms"] = torch.sqrt(_amax0(sumsq / row_cnt))
        out["weight_absmax"] = _par(buf, op, "weight_absmax")
        out["nonfinite"] = out["nonfinite"] + _par(buf, op, "weight_nonfinite")
    elif op == "softmax":
        rmax, rmin = _col(buf, op, "max"), _col(buf, op, "min")  # (rows,) ±inf where no finite entry
        has = rmax >= rmin  # (rows,) the row has a finite entry
        any_fin = has.any() if has.numel() else torch.zeros((), dtype=torch.bool, device=buf.device)
        out["n"] = float(n)
        out["max"] = torch.where(any_fin, _amax0(rmax), 0.0)
        out["min"] = torch.where(any_fin, -_amax0(-rmin), 0.0)
        out["max_row_range"] = _amax0(torch.where(has, rmax - rmin, 0.0))
        out["masked_rows"] = (neginf == n).sum().to(torch.float64)
        out["masked_frac"] = neginf.sum() / max(numel, 1)
    elif op == "layernorm":
        mean, std = _col(buf, op, "mean").abs(), _col(buf, op, "std")  # (rows,)
        ratio = torch.where(std > 0, mean / std, torch.where(mean > 0, RATIO_CAP, 0.0)).clamp(max=RATIO_CAP)
        out["hidden"] = float(n)
        out["max_mean_over_std"] = _amax0(ratio)
        out["min_row_std"] = -_amax0(-std)
        out["weight_absmax"] = _par(buf, op, "weight_absmax")
        out["bias_absmax"] = _par(buf, op, "bias_absmax")
        out["nonfinite"] = out["nonfinite"] + _par(buf, op, "param_nonfinite")
    elif op == "rope":
        seq, heads, d = (int(s) for s in shape)
        out.update(seq=float(seq), heads=float(heads), d=float(d), base=float(params["base"]))
        out["max_pos"] = _amax0(_col(buf, op, "abspos"))
    return out


def reduce_sketch(
    op: str, buffer: torch.Tensor, shape: Sequence[int], params: dict[str, Any] | None = None
) -> tuple[tuple[str, ...], torch.Tensor]:
    """(feature names in optwin.ingest's order, float64 tensor on the buffer's device); no host sync.

    `shape` is the main input's shape (x), `params` the op's params (rope: base).
    """
    from optwin.ingest.sketch import SKETCH_FEATURES  # torch + catalog only

    operator(op)
    if op not in LAYOUTS:
        raise InputError(f"{op}: no Triton sketch kernel; expected one of {', '.join(LAYOUTS)}")
    rows = math.prod(shape[:-1]) if op != "rope" else int(shape[0])
    want = (n_rows(op, rows), n_cols(op))
    if tuple(buffer.shape) != want:
        raise InputError(f"{op}: sketch buffer has shape {tuple(buffer.shape)}, expected {want} for input {tuple(shape)}")
    vals = _features(op, buffer, shape, resolve_params(op, params))
    names = SKETCH_FEATURES[op]
    host = [i for i, k in enumerate(names) if not isinstance(vals[k], torch.Tensor)]
    dev = [i for i, k in enumerate(names) if isinstance(vals[k], torch.Tensor)]
    out = torch.empty(len(names), dtype=torch.float64, device=buffer.device)
    # one host->device copy for the shape features, one stack for the reductions (no sync)
    out[host] = torch.tensor([float(vals[names[i]]) for i in host], dtype=torch.float64).to(buffer.device, non_blocking=True)
    out[dev] = torch.stack([vals[names[i]].to(torch.float64).reshape(()) for i in dev])
    return names, out


def read_sketch(
    op: str, buffer: torch.Tensor, shape: Sequence[int], params: dict[str, Any] | None = None
) -> dict[str, float]:
    """The sketch as {feature: float} (same keys as optwin.ingest.sketch); one host sync."""
    names, values = reduce_sketch(op, buffer, shape, params)
    return dict(zip(names, values.tolist()))
