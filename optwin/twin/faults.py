"""The fault predicates of the spec (shared/spec/operators.md, "Faults"), batched over replays.

Given the variant's output `y` and the float64 reference `r` from the same dtype-rounded inputs:
- nonfinite:      any element of y is NaN or +-Inf;
- precision_loss: not nonfinite, and ||y - r||_2 / ||r||_2 > tau over the elements where r is
                  finite (tau from `Tolerances.precision_tau`);
- low_entropy:    softmax/attention only: more than half of the rows of the float64 probability
                  matrix (rows with a finite reference) have entropy below 0.3 nats.
All functions take `y` with optional leading batch dims beyond `r`'s shape and reduce over the
trailing `r.ndim` dims, so R replays are judged in one call.
"""

from __future__ import annotations

import torch

from optwin.catalog import DEFAULT_TOLERANCES, Tolerances, operator


def relative_error(y: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """||y - r|| / ||r|| over finite-reference elements, reduced over r's dims (batched over y's lead)."""
    dims = tuple(range(-r.ndim, 0))
    finite_r = torch.isfinite(r)
    r0 = torch.where(finite_r, r, torch.zeros_like(r))
    diff = torch.where(finite_r, y - r0, torch.zeros_like(y))
    num = torch.linalg.vector_norm(diff, dim=dims)
    den = torch.linalg.vector_norm(r0, dim=dims)
    # ||r|| == 0: any deviation is total loss; no deviation none.
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)),
                       torch.where(num > 0, torch.full_like(num, float("inf")), torch.zeros_like(num)))


def nonfinite(y: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    dims = tuple(range(-r.ndim, 0))
    return (~torch.isfinite(y)).any(dim=dims) if dims else ~torch.isfinite(y)


def row_entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each row of a probability matrix (0 log 0 = 0)."""
    logp = torch.where(p > 0, torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p))
    return -(p * logp).sum(-1)


def low_entropy(r_prob: torch.Tensor, tol: Tolerances = DEFAULT_TOLERANCES) -> torch.Tensor:
    """From the float64 reference probabilities (..., n): > half of the finite rows peaked."""
    rows = r_prob.reshape(-1, r_prob.shape[-1])
    finite_rows = torch.isfinite(rows).all(-1)
    if not bool(finite_rows.any()):
        return torch.tensor(False)
    h = row_entropy(rows[finite_rows])
    return (h < tol.low_entropy_nats).double().mean() > tol.low_entropy_row_fraction


def fault_flags(op: str, dtype: str, y: torch.Tensor, r: torch.Tensor, r_prob: torch.Tensor | None = None,
                tol: Tolerances | None = None) -> dict[str, torch.Tensor]:
    """Fault type -> bool tensor shaped like y's extra leading dims (a 0-d tensor for one output).

    `r_prob` is the float64 probability matrix for softmax/attention (the attention weights), needed
    for low_entropy; for softmax it is `r` itself.
    """
    tol = tol or DEFAULT_TOLERANCES
    spec = operator(op)
    tau = tol.precision_tau(op, spec.out_dtype(dtype))
    nf = nonfinite(y, r)
    flags = {"nonfinite": nf, "precision_loss": (~nf) & (relative_error(y, r) > tau)}
    if "low_entropy" in spec.fault_types:
        probs = r if r_prob is None else r_prob
        flags["low_entropy"] = low_entropy(probs, tol).expand(nf.shape)
    return flags
