"""Synthetic operator inputs: `Case`, per-op constructors, `default_sweep` and `boundary_sweep`.

    python -c "from optwin.ingest import boundary_sweep; print([c.family for c in boundary_sweep('softmax', 'float16', 8, 0)])"

The fingerprint builder replays twins over these cases. Every generator is deterministic for a
seed (numpy PCG64 seeded with (seed, op, case index), so case i does not depend on n_cases), returns
CPU tensors in the op's dtype (rope positions int64; geodesic float32 degrees) under every catalog
input name, plus the op's params, and a `family` string saying how the case was made.

Constructors (`make_<op>`) take explicit targets for the fault-driving sketch features and hit them
exactly in float64 before the cast to dtype (the cast then rounds, like a real model's tensors):
the sweeps draw targets from wide log-uniform ranges, `fit.sample_inputs` draws them from
distributions fitted to captured profiles. Values are clipped to the dtype's finite range, so no
input is NaN/±Inf (twins require finite inputs; softmax masks are -inf on purpose).

Shapes stay small enough for an FP64 CPU twin: rows <= 64, hidden <= 1024, attention seq <= 128,
matmul dims <= 256, geodesic n <= 512.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch

from optwin.catalog import CATALOG, operator
from optwin.errors import CatalogError

MAX_ROWS = 64
MAX_HIDDEN = 1024
MAX_SEQ = 128
MAX_MATMUL = 256
MAX_POINTS = 512

VALUE_FAMILIES: tuple[str, ...] = ("normal", "heavy", "outlier", "uniform")
_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class Case:
    """One synthetic call: `inputs` by catalog name, `params`, and the `family` that made it.

    Unpacks as `(inputs, params)` so `for inputs, params in cases` works too.
    """

    inputs: dict[str, torch.Tensor]
    params: dict[str, Any] = field(default_factory=dict)
    family: str = ""

    def __iter__(self) -> Iterator[Any]:
        yield self.inputs
        yield self.params


# ----------------------------------------------------------------------------- helpers


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Catalog dtype name (or torch dtype) -> torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _TORCH_DTYPES[dtype]
    except (KeyError, TypeError):
        raise CatalogError(f"unknown dtype {dtype!r}; expected one of {', '.join(_TORCH_DTYPES)}") from None


def dtype_name(dtype: str | torch.dtype) -> str:
    t = torch_dtype(dtype)
    return next(k for k, v in _TORCH_DTYPES.items() if v == t)


def _check(op: str, dtype: str | torch.dtype) -> tuple[str, torch.dtype]:
    spec = operator(op)
    name = dtype_name(dtype)
    if name not in spec.dtypes:
        raise CatalogError(f"{op}: unsupported dtype {name!r}; expected one of {', '.join(spec.dtypes)}")
    return name, torch_dtype(name)


def seed_words(seed: int) -> list[int]:
    """Generator entropy words of a seed, from all of its bits: seeds 0..2**32-1 are one word (the
    streams they always drew); any other seed (negative, or 2**32 and up, which build accepts) is the
    four 32-bit words of a hash of its signed bytes, a longer prefix, so it never lands on another
    seed's stream (truncating to the low 32 bits made 2**32 replay seed 0 and -1 replay 2**32-1)."""
    s = int(seed)
    if 0 <= s < 2**32:
        return [s]
    digest = hashlib.blake2b(s.to_bytes(s.bit_length() // 8 + 1, "little", signed=True), digest_size=16).digest()
    return [0x5EED] + [int(w) for w in np.frombuffer(digest, dtype="<u4")]


def case_rng(seed: int, op: str, i: int, salt: int = 0) -> np.random.Generator:
    """Independent stream per (seed, op, case, salt): case i is the same whatever n_cases is."""
    return np.random.default_rng([*seed_words(seed), list(CATALOG).index(op), i, salt])


def loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def to_tensor(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """float64 array -> tensor in dtype, clipped to the dtype's finite range (-inf kept: masks)."""
    big = torch.finfo(dtype).max
    a = np.where(np.isneginf(a), a, np.clip(a, -big, big))
    return torch.from_numpy(np.ascontiguousarray(a)).to(dtype)


def values(rng: np.random.Generator, family: str, shape: tuple[int, ...]) -> np.ndarray:
    """Unit-scale values of one family; the last dim is the channel dim.

    normal: N(0, 1). heavy: Student-t with 1.5..4 degrees of freedom (rare huge entries).
    outlier: N(0, 1) with 1-4 channels scaled 20..500x, like LLM activation outlier channels.
    uniform: random signs times U(0.5, 1): absmax close to rms (every element large).
    """
    if family == "normal":
        return rng.standard_normal(shape)
    if family == "heavy":
        return rng.standard_t(rng.uniform(1.5, 4.0), size=shape)
    if family == "outlier":
        z = rng.standard_normal(shape)
        c = shape[-1]
        idx = rng.choice(c, size=min(c, int(rng.integers(1, 5))), replace=False)
        z[..., idx] *= rng.uniform(20, 500, size=len(idx))
        return z
    if family == "uniform":
        return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.5, 1.0, size=shape)
    raise ValueError(f"unknown value family {family!r}")


def _nonzero(z: np.ndarray) -> np.ndarray:
    """Avoid an all-zero draw (never test on zeros)."""
    return z if np.any(z) else np.ones_like(z)


def _solve_pair_scale(target_prod: float, na: float, nb: float, target_abs: float | None,
                      aa: float, ab: float) -> tuple[float, float]:
    """Scales (alpha, beta) with alpha*beta*na*nb = target_prod and max(alpha*aa, beta*ab) = target_abs.

    Used for matmul (row/col norms) and attention (q/k norms). Without target_abs, split evenly.
    When both constraints cannot hold, the product constraint wins.
    """
    prod = target_prod / (na * nb)
    if target_abs is None:
        s = math.sqrt(prod)
        return s, s
    alpha = target_abs / aa
    beta = prod / alpha
    if beta * ab > target_abs * (1 + 1e-12):
        beta = target_abs / ab
        alpha = prod / beta
    return alpha, beta


def _leading(rng: np.random.Generator, rows: int) -> tuple[int, ...]:
    """[rows] or, now and then, [2, rows/2]: twins must handle any leading dims."""
    if rows % 2 == 0 and rows >= 4 and rng.random() < 0.3:
        return (2, rows // 2)
    return (rows,)


# ----------------------------------------------------------------------------- row construction


def split_product(p: float, a: float, d: int) -> tuple[float, float, float, float | None]:
    """Norms (n1, n2) with n1 * n2 = p for two row sets of width d whose overall max |x| is a.

    A row of width d with max |x| = a has a 2-norm within [a, a sqrt(d)]. Returns (n1, n2, a1, a2):
    the max norms and per-set absmax targets (a2 None: unconstrained, it stays below n2 < a).
    When p > a^2 d no rows can hold both targets: the product wins and absmax grows.
    """
    lo, hi = a, a * math.sqrt(max(d, 1))
    g = math.sqrt(p)
    if lo <= g <= hi:
        return g, g, a, a
    if g < lo:
        return a, p / a, a, None
    return g, g, g / math.sqrt(max(d, 1)), g / math.sqrt(max(d, 1))


def rows_with(rng: np.random.Generator, family: str, shape: tuple[int, ...], max_norm: float,
              absmax: float | None = None) -> np.ndarray:
    """Values of `family` whose rows (last dim) have max 2-norm `max_norm` and, when given, whose
    max |x| is `absmax`. One random row carries both targets (one spike of size absmax, the rest of
    equal magnitude; the norm is clamped into [absmax, absmax sqrt(d)] where it must be); the other
    rows keep the family's shape, scaled to 0.3..1 of the max norm and clipped at absmax."""
    z = _nonzero(values(rng, family, shape)).reshape(-1, shape[-1])  # (rows, d)
    rows, d = z.shape
    nz = np.linalg.norm(z, axis=1, keepdims=True)
    z = z / np.where(nz > 0, nz, 1) * (max_norm * rng.uniform(0.3, 1.0, size=(rows, 1)))
    r0 = int(rng.integers(rows))
    if absmax is None:
        z[r0] *= max_norm / max(np.linalg.norm(z[r0]), 1e-300)
        return z.reshape(shape)
    z = np.clip(z, -absmax, absmax)
    n = min(max(max_norm, absmax), absmax * math.sqrt(d))
    b = math.sqrt(max(n * n - absmax * absmax, 0.0) / max(d - 1, 1))
    z[r0] = rng.choice([-1.0, 1.0], size=d) * b
    z[r0, int(rng.integers(d))] = absmax * rng.choice([-1.0, 1.0])
    return z.reshape(shape)


# ----------------------------------------------------------------------------- constructors


# Least scale the rms aims give a row: when the top row alone already passes the rms target, the aim
# would scale every other row to 0 (all-zero rows; constant rows for layernorm), which no capture had.
C_FLOOR = 0.1


def outlier_channel_rows(rng: np.random.Generator, rows: int, hidden: int, absmax: float, max_row_rms: float,
                         rms: float) -> np.ndarray | None:
    """x [rows, hidden] whose outliers sit in 1-4 channels shared by every row, as in LLM activations:
    max|x| = absmax and max row rms = max_row_rms exactly, overall rms aimed at `rms`. None when
    absmax/rms is no more than normal values' own tail gives (no outlier channels to model)."""
    k = min(int(rng.integers(1, 5)), hidden // 4)
    if k < 1 or rms <= 0 or absmax / rms <= 1.5 * math.sqrt(2 * math.log(max(rows * hidden, 2))):
        return None
    ch = rng.choice(hidden, size=k, replace=False)
    bulk = np.setdiff1d(np.arange(hidden), ch)
    s = np.concatenate([[1.0], rng.uniform(0.5, 1.0, size=k - 1)])  # channel scales; ch[0] holds absmax
    budget = hidden * max_row_rms**2 / absmax**2  # sum of s^2 that keeps the top row's rms at max_row_rms
    if k > 1 and (s * s).sum() > budget:
        s[1:] *= math.sqrt(max(budget - 1.0, 0.0) / (s[1:] ** 2).sum())
    # The top row (absmax, max_row_rms); every other row is it scaled by c <= 1, so their rms
    # follow from the c's, set so that the overall rms is `rms`.
    var = max(hidden * max_row_rms**2 - absmax**2 * (s * s).sum(), 0.0) / len(bulk)
    c = rng.uniform(0.3, 1.0, size=rows)
    r0 = int(rng.integers(rows))
    others = np.arange(rows) != r0
    want = max(rows * rms**2 / max_row_rms**2 - 1.0, 0.0)  # sum of the other rows' c^2
    for _ in range(8):  # rescale, clip to [C_FLOOR, 1]: converges in a few rounds
        c[others] = np.clip(c[others] * math.sqrt(want / max((c[others] ** 2).sum(), 1e-300)), C_FLOOR, 1.0)
    c[r0] = 1.0
    z = rng.standard_normal((rows, len(bulk)))
    z /= np.sqrt((z * z).mean(1, keepdims=True))  # unit rms per row
    x = np.empty((rows, hidden))
    x[:, bulk] = np.clip(z * math.sqrt(var), -absmax, absmax) * c[:, None]
    x[:, ch] = absmax * s * rng.choice([-1.0, 1.0], size=(rows, k)) * c[:, None]
    return x


def make_rmsnorm(rng: np.random.Generator, dtype: torch.dtype, *, rows: int, hidden: int, family: str,
                 absmax: float, max_row_rms: float | None = None, weight_absmax: float | None = None,
                 rms: float | None = None) -> Case:
    """x [rows, hidden] with max|x| = absmax (and max row rms = max_row_rms when given). With rms too
    (profile samples), outliers far above rms sit in channels shared by every row
    (outlier_channel_rows), not in one random row and channel."""
    x = None if max_row_rms is None or rms is None else outlier_channel_rows(rng, rows, hidden, absmax, max_row_rms, rms)
    if x is not None:
        family = f"{family}+outlier-channels"
    elif max_row_rms is None:
        z = _nonzero(values(rng, family, (rows, hidden)))
        x = z * (absmax / np.abs(z).max())
    else:  # both targets exact where feasible: rms <= absmax <= sqrt(hidden) rms
        x = rows_with(rng, family, (rows, hidden), max_row_rms * math.sqrt(hidden), absmax)
    wa = weight_absmax if weight_absmax is not None else (loguniform(rng, 0.5, 4.0) if rng.random() < 0.5 else 1.0)
    w = 1.0 + 0.1 * rng.standard_normal(hidden)
    w = w * (wa / np.abs(w).max())
    return Case({"x": to_tensor(x.reshape(*_leading(rng, rows), hidden), dtype), "weight": to_tensor(w, dtype)}, {}, family)


def _mask(rng: np.random.Generator, kind: str, rows: int, n: int, masked_rows: int) -> np.ndarray:
    """Boolean mask (True = -inf) of one kind: none, causal (HF eager), padding, plus full rows."""
    m = np.zeros((rows, n), dtype=bool)
    if kind == "causal":
        off = max(n - rows, 0)  # queries are the last `rows` positions of n keys
        m = np.arange(n)[None, :] > (np.arange(rows)[:, None] + off)
    elif kind == "padding":
        pad = rng.integers(0, max(n // 2, 1), size=rows)
        m = np.arange(n)[None, :] >= (n - pad)[:, None]
    if masked_rows:
        m[rng.choice(rows, size=min(masked_rows, rows), replace=False)] = True
    return m


def make_softmax(rng: np.random.Generator, dtype: torch.dtype, *, rows: int, n: int, family: str, max: float,
                 max_row_range: float, mask: str = "none", masked_rows: int = 0, min_row_max: float | None = None,
                 min: float | None = None, rms: float | None = None, peaked_frac: float | None = None) -> Case:
    """x [rows, n] with largest finite value `max` and widest row range `max_row_range`.

    With min_row_max (what fit.sample_inputs passes), the rows are built as a captured call's are
    (_softmax_rows): that, min and peaked_frac are aimed at too, and a far-off `min` is a finite mask
    value (finfo.min, -1e9) shared by every row, kept apart from the unmasked scores' spread."""
    m = _mask(rng, mask, rows, n, masked_rows)
    z = values(rng, family, (rows, n))
    zm = np.where(m, np.nan, z)
    live = ~m.all(-1)  # rows with some finite entry
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # fully masked rows: all-NaN slices, handled below
        lo, hi = np.nanmin(zm, -1, keepdims=True), np.nanmax(zm, -1, keepdims=True)  # (rows, 1)
    span = np.where(np.isfinite(hi - lo) & (hi - lo > 0), hi - lo, 1.0)
    unit = np.where(m, 0.0, (z - np.nan_to_num(hi)) / span)  # each live row spans [-1, 0] (or is constant)
    tag = family + ("" if mask == "none" else f"+{mask}") + ("+masked-rows" if masked_rows else "")
    if min_row_max is not None:
        x, filled = _softmax_rows(rng, m, unit, max, max_row_range, min_row_max, max - max_row_range if min is None else min,
                                  rms, peaked_frac)
        return Case({"x": to_tensor(x, dtype)}, {}, tag + ("+finite-mask" if filled else ""))
    ranges = max_row_range * rng.uniform(0.2, 1.0, size=(rows, 1))
    tops = max - np.abs(rng.normal(0, 0.1 * max_row_range + 1e-3, size=(rows, 1)))
    first = int(np.flatnonzero(live)[0]) if live.any() else 0
    ranges[first], tops[first] = max_row_range, max  # one row carries both targets exactly
    x = np.where(m, -np.inf, unit * ranges + tops)
    return Case({"x": to_tensor(x, dtype)}, {}, tag)


# A drawn max_row_range this close to max - min says every row reaches the same low value: a finite
# mask (captured calls have it exactly; copula draws only nearly). Unmasked rows, whose lows differ,
# sit near 0.85..0.9 of it (the row with the max rarely holds the min too).
SHARED_LOW = 0.98


def _entropy(x: np.ndarray) -> np.ndarray:
    """Softmax entropy (nats) per row of x (rows, n), -inf masked, every row with a finite entry."""
    mx = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - mx)  # (rows, n), 0 where masked
    s = e.sum(-1)
    t = np.where(e > 0, e * np.where(np.isfinite(x), x - mx, 0.0), 0.0).sum(-1)
    return np.log(s) - t / s


def _softmax_rows(rng: np.random.Generator, m: np.ndarray, unit: np.ndarray, top: float, max_row_range: float,
                  min_row_max: float, low: float, rms: float | None, peaked_frac: float | None) -> tuple[np.ndarray, bool]:
    """Rows (-inf where m) of: a top t_i, a share of entries at a low l_i, and the unmasked scores
    t_i + w_i * unit in between. Exact: max (one row's top), min_row_max (another row's top, or a
    row constant at the finite mask), max_row_range (the max row's range), min; peaked_frac is aimed
    at through the widths w_i (a row's entropy falls as its scores spread).

    A finite mask (max_row_range ~ max - min): every row's low is `low`, on a share of its entries
    that matches rms (the mask value dominates it), and when min_row_max is the mask value, some rows
    are that value throughout (padded queries). Widths start from the scores' own scale, about |max|,
    never from the mask's range, which would make every row peaked."""
    from optwin.catalog import DEFAULT_TOLERANCES

    rows, n = m.shape
    live = np.flatnonzero(~m.all(-1))
    x = np.full((rows, n), -np.inf)
    if not len(live):
        return x, False
    max_row_range = max(max_row_range, 0.0)
    low = min(low, top)
    shared = top - low > 0 and max_row_range >= SHARED_LOW * (top - low)
    first = int(live[0])  # carries max and max_row_range
    others = live[1:]
    const = np.zeros(rows, dtype=bool)
    if shared and len(others) and min_row_max <= low + 1e-6 * max(abs(low), 1.0):
        # Rows at the mask value throughout; how many: rms ~ |low| sqrt(share of entries at low).
        share = float(np.clip((rms / low) ** 2, 0.0, 1.0)) if rms is not None and low != 0 else 0.5
        k = int(np.clip(round(len(live) * share * rng.uniform(0.3, 0.9)), 1, len(others)))
        const[rng.choice(others, size=k, replace=False)] = True
    # Tops within [min_row_max, max]: the max row, a row at min_row_max, the rest between.
    tmin = top if const.any() else min(min_row_max, top)
    tops = np.full(rows, top)
    free = np.flatnonzero(~const & ~m.all(-1))
    free = free[free != first]
    if len(free):
        tops[free] = rng.uniform(tmin, top, size=len(free))
        if not const.any():
            tops[free[0]] = tmin
    # Lows: the max row reaches max - max_row_range; shared: every row reaches the mask value.
    if shared:
        lows = np.full(rows, low)
    else:
        lows = tops - max_row_range * rng.uniform(0.2, 1.0, size=rows)
        if len(free):
            lows[free[0]] = max(low, tops[free[0]] - max_row_range)  # carries min when it can
    lows = np.clip(lows, np.maximum(low, tops - max_row_range), tops)
    lows[first] = top - max_row_range
    ranges = tops - lows
    # Share of a row's finite entries at its low: one entry, or for a mask what rms says.
    fin = ~m
    nfin = fin.sum(-1)
    share = 1.0 / np.maximum(nfin, 1)
    if shared and rms is not None and low != 0:
        total = float(np.clip((rms / low) ** 2, 0.0, 1.0)) * fin.sum()  # entries at the mask value
        rest = max(total - (nfin * const).sum(), 0.0) / max(float(nfin[~const].sum()), 1.0)
        share = np.maximum(share, np.minimum(rest, (nfin - 2) / np.maximum(nfin, 1)))
    at_low = fin & (rng.random((rows, n)) < share[:, None])
    # Keep each row's top entry (unit 0) off the low; make sure a row with a range has a low entry.
    at_low &= unit < 0
    need = (ranges > 0) & ~at_low.any(-1) & (nfin >= 2)
    for r in np.flatnonzero(need):
        cand = np.flatnonzero(fin[r] & (unit[r] < 0))
        if len(cand):
            at_low[r, cand[int(np.argmin(unit[r, cand]))]] = True
    scale = max(abs(top), abs(tmin - top) if not shared else 0.0, 1.0)
    widths = ranges.copy() if not shared else np.minimum(ranges, 1.5 * scale)

    gaps = np.zeros(rows)  # sharpened rows: every score but the top moved this far down

    def build(w: np.ndarray, idx: np.ndarray, g: np.ndarray | None = None) -> np.ndarray:
        body = tops[idx, None] + w[:, None] * unit[idx] - (gaps[idx] if g is None else g)[:, None] * (unit[idx] < 0)
        return np.where(m[idx], -np.inf, np.where(at_low[idx], lows[idx, None], np.maximum(body, lows[idx, None])))

    if peaked_frac is not None:
        thr = DEFAULT_TOLERANCES.low_entropy_nats
        adj = live[~const[live] & (nfin[live] >= 2) & (ranges[live] > 0)]
        h = _entropy(build(widths[adj], adj)) if len(adj) else np.zeros(0)
        fixed = int((nfin[live] == 1).sum())  # one finite entry: always peaked
        want = int(round(float(peaked_frac) * len(live))) - fixed
        peaked = adj[h < thr]
        if len(peaked) > want:  # flatten some: narrower scores until the entropy clears the threshold
            sel = rng.permutation(peaked)[: len(peaked) - max(want, 0)]
            lo_w, hi_w = np.zeros(len(sel)), widths[sel].copy()
            for _ in range(40):
                mid = (lo_w + hi_w) / 2
                ok = _entropy(build(mid, sel)) >= thr + 0.1
                lo_w, hi_w = np.where(ok, mid, lo_w), np.where(ok, hi_w, mid)
            widths[sel] = lo_w
        elif len(peaked) < want:  # sharpen some: a low up to max_row_range away, scores spread toward it
            flat = adj[h >= thr]
            kept = lows.copy()
            lows[flat] = np.maximum(low, tops[flat] - max_row_range) if not shared else lows[flat]
            ranges[flat] = tops[flat] - lows[flat]

            def sharp(sv: np.ndarray, idx: np.ndarray) -> np.ndarray:  # sv in [0, 1]; 1: all but the top at the low
                return _entropy(build(widths[idx] + sv * (ranges[idx] - widths[idx]), idx, sv * ranges[idx]))

            can = flat[sharp(np.ones(len(flat)), flat) < thr - 0.1] if len(flat) else flat
            sel = rng.permutation(can)[: want - len(peaked)]
            back = np.setdiff1d(flat, sel)  # rows left flat keep their own low
            lows[back] = kept[back]
            ranges = tops - lows
            lo_s, hi_s = np.zeros(len(sel)), np.ones(len(sel))
            for _ in range(40):
                mid = (lo_s + hi_s) / 2
                ok = sharp(mid, sel) < thr - 0.1
                lo_s, hi_s = np.where(ok, lo_s, mid), np.where(ok, mid, hi_s)
            widths[sel] += hi_s * (ranges[sel] - widths[sel])
            gaps[sel] = hi_s * ranges[sel]
    x[live] = build(widths[live], live)
    x[const] = np.where(m[const], -np.inf, low)
    return x, shared


def make_rope(rng: np.random.Generator, dtype: torch.dtype, *, seq: int, heads: int, d: int, family: str,
              max_pos: int, absmax: float, base: float = CATALOG["rope"].params["base"]) -> Case:
    """x [seq, heads, d] with max|x| = absmax and max position exactly max_pos."""
    z = _nonzero(values(rng, family, (seq, heads, d)))
    x = z * (absmax / np.abs(z).max())
    if max_pos >= seq - 1:  # one sequence decoding at depth: max_pos-seq+1 .. max_pos
        pos = torch.arange(int(max_pos) - seq + 1, int(max_pos) + 1, dtype=torch.int64)
    else:  # a flattened batch of short sequences (what capture records): 0..max_pos repeated
        pos = torch.arange(seq, dtype=torch.int64) % (int(max_pos) + 1)
    return Case({"x": to_tensor(x, dtype), "positions": pos}, {"base": float(base)}, family)


def _row_entropy(scores: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """Softmax entropy (nats) of each row of scores (rows, keys; -inf hidden) scaled by scale (rows,), or as they
    are, with the sketch's own computation (every row keeps a visible key, so every row is eligible)."""
    from optwin.ingest.sketch import logit_row_entropy

    return logit_row_entropy(torch.from_numpy(scores if scale is None else scores * scale[:, None]))[0].numpy()


# Keys _steer_rows tries per query row: its highest-scoring ones, then its longest key.
STEER_KEYS = 4


def _steer_rows(qr: np.ndarray, kb: np.ndarray, seq_q: int, scores: np.ndarray, rows: np.ndarray, need: int,
                cap_norm: float, cap_abs: float, goal: float) -> tuple[np.ndarray, np.ndarray]:
    """Up to `need` of `rows` (query rows of qr (rows, d), tried in order) turned toward one of their
    visible keys until their attention entropy is below `goal`: (the rows, their new values).

    Rescaling alone leaves a random query row flat when its keys are few and its scores close: a
    row of 12 keys needs its top score ~5.5 above the rest to fall below 0.3 nats, more than a
    random direction in d = 32 gives even at the largest norm. A real encoder's peaked rows are a
    query aligned with one key ([CLS], [SEP]); here a row moves along the great circle from its own
    direction toward a key (one of its STEER_KEYS highest-scoring keys, else its longest key), just
    far enough, at the largest norm the caps allow (cap_norm: the largest row norm, so score_bound
    stays; cap_abs: the largest |q|, so absmax stays). kb: (batch*heads, seq_k, d), row i's keys are
    kb[i // seq_q]; scores: (rows, seq_k), qr's scaled scores, -inf where hidden. Rows that no
    candidate key makes peaked are left out."""
    d = qr.shape[1]
    sqd = math.sqrt(d)
    m = STEER_KEYS + 1
    chunk = max(1, (1 << 22) // (m * scores.shape[1]))  # float64 score elements formed at once
    knorm = np.linalg.norm(kb, axis=2)  # (batch*heads, seq_k)
    got_rows: list[np.ndarray] = []
    got_vals: list[np.ndarray] = []
    have = 0
    for start in range(0, len(rows), chunk):
        if have >= need:
            break
        r = rows[start:start + chunk]
        bh, sc = r // seq_q, scores[r]  # (n,), (n, seq_k)
        vis = np.isfinite(sc)
        top = np.argsort(np.where(vis, -sc, np.inf), axis=1, kind="stable")[:, :STEER_KEYS]  # highest scores first
        opts = np.concatenate([top, np.where(vis, knorm[bh], -1.0).argmax(axis=1)[:, None]], axis=1)  # (n, m)
        opts = np.where(np.take_along_axis(vis, opts, axis=1), opts, opts[:, :1])  # fewer keys: repeat the top one
        u = kb[bh[:, None], opts]  # (n, m, d)
        u = u / np.maximum(np.linalg.norm(u, axis=2, keepdims=True), 1e-300)
        ku = np.empty((len(r), m, scores.shape[1]))  # u . k_j / sqrt(d): the scores of a unit row along u
        for g in np.unique(bh):
            sel = bh == g
            ku[sel] = np.einsum("nmd,kd->nmk", u[sel], kb[g]) / sqd
        s1 = np.minimum(cap_norm, cap_abs / np.maximum(np.abs(u).max(axis=2), 1e-300))  # (n, m)
        pick = np.full(len(r), -1)  # the first candidate key whose row, pointing at it, is peaked
        for j in range(m):  # a later key only for the rows the earlier ones leave flat
            left = np.flatnonzero(pick < 0)
            full = np.where(vis[left], ku[left, j] * s1[left, j, None], -np.inf)
            pick[left[_row_entropy(full) < goal]] = j
        ok = np.flatnonzero(pick >= 0)[: need - have]
        if not len(ok):
            continue
        pick = pick[ok]
        r, vis, u, b = r[ok], vis[ok], u[ok, pick], ku[ok, pick]  # b: (n, seq_k)
        qn = np.maximum(np.linalg.norm(qr[r], axis=1, keepdims=True), 1e-300)
        qh, a = qr[r] / qn, sc[ok] / qn  # unit rows and their unit-row scores

        def at(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """(row, its scaled scores) turned by t in [0, 1] from qh toward u, at the caps."""
            w = (1 - t)[:, None] * qh + t[:, None] * u
            wn = np.maximum(np.linalg.norm(w, axis=1), 1e-300)
            size = np.minimum(cap_norm, cap_abs * wn / np.maximum(np.abs(w).max(axis=1), 1e-300))  # (n,)
            c = (size / wn)[:, None]
            return w * c, np.where(vis, ((1 - t)[:, None] * a + t[:, None] * b) * c, -np.inf)

        lo, hi = np.zeros(len(r)), np.ones(len(r))  # hi stays a turn that reaches the goal
        for _ in range(12):  # bisection on the turn (to 2e-4: a turn a little past the least is as good)
            mid = (lo + hi) / 2
            ok_mid = _row_entropy(at(mid)[1]) < goal
            lo, hi = np.where(ok_mid, lo, mid), np.where(ok_mid, mid, hi)
        got_rows.append(r)
        got_vals.append(at(hi)[0])
        have += len(r)
    if not got_rows:
        return np.zeros(0, dtype=np.int64), np.zeros((0, d))
    return np.concatenate(got_rows), np.concatenate(got_vals)


def _aim_peaked_frac(q: np.ndarray, k: np.ndarray, causal: bool, target: float) -> np.ndarray:
    """q with its query rows rescaled (or turned) so that about `target` of the attention rows have
    entropy below the low_entropy threshold. A row's entropy falls as its norm grows, so rows are
    shrunk (flatter) or grown up to the largest row norm and the largest |q| (sharper): score_bound
    and absmax stay. Rows that growing leaves flat are then turned toward one of their keys within
    the same caps (_steer_rows). The rows that carry those two maxima are left alone; targets no
    rescaling or turning can reach are missed."""
    from optwin.catalog import DEFAULT_TOLERANCES

    thr = DEFAULT_TOLERANCES.low_entropy_nats
    batch, heads, seq_q, d = q.shape
    seq_k = k.shape[2]
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d)  # (batch, heads, seq_q, seq_k)
    if causal:
        scores = np.where(np.arange(seq_k)[None, :] > np.arange(seq_q)[:, None], -np.inf, scores)
    scores = scores.reshape(-1, seq_k)  # (rows, seq_k)
    qr = q.reshape(-1, d)
    norms, amax = np.linalg.norm(qr, axis=1), np.abs(qr).max(axis=1)
    free = np.ones(len(qr), dtype=bool)
    free[[int(np.argmax(norms)), int(np.argmax(amax))]] = False
    grow = np.minimum(norms.max() / np.maximum(norms, 1e-300), amax.max() / np.maximum(amax, 1e-300))  # (rows,)
    ones = np.ones(len(qr))
    entropy = _row_entropy(scores, ones)
    peaked = entropy < thr
    want = int(round(target * len(qr))) - int(peaked[~free].sum())
    free_peaked = np.flatnonzero(free & peaked)
    scale = ones.copy()
    steered = np.zeros(0, dtype=np.int64)
    if len(free_peaked) > want:  # flatten some: shrink until the entropy clears the threshold
        flattenable = free_peaked[np.isfinite(scores[free_peaked]).sum(axis=1) >= 2]  # one key: always peaked
        rows = flattenable[: len(free_peaked) - max(want, 0)]
        lo, hi = np.zeros(len(rows)), np.ones(len(rows))
        for _ in range(40):  # bisection on the scale; entropy is monotone in it
            mid = (lo + hi) / 2
            ok = _row_entropy(scores[rows], mid) >= thr + 0.1
            lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
        scale[rows] = lo
    elif len(free_peaked) < want:  # sharpen some: grow rows that become peaked at their largest scale
        candidates = np.flatnonzero(free & ~peaked)
        sharp = _row_entropy(scores[candidates], grow[candidates]) < thr
        can = candidates[sharp]
        rows = can[: want - len(free_peaked)]
        scale[rows] = grow[rows]
        short = want - len(free_peaked) - len(rows)
        if short > 0:  # then turn some of the rest toward a key, the nearest to peaked first
            rest = candidates[~sharp]
            rest = rest[np.argsort(entropy[rest], kind="stable")]
            steered, vals = _steer_rows(qr, k.reshape(batch * heads, seq_k, d), seq_q, scores, rest, short,
                                        float(norms.max()), float(amax.max()), thr - 0.1)
    out = qr * scale[:, None]
    if len(steered):
        out[steered] = vals
    return out.reshape(q.shape)


def make_attention(rng: np.random.Generator, dtype: torch.dtype, *, batch: int, heads: int, seq_q: int, seq_k: int,
                   d: int, family: str, score_bound: float, absmax: float | None = None, causal: bool = False,
                   aligned: bool = False, v_scale: float = 1.0, peaked_frac: float | None = None) -> Case:
    """q, k, v [batch, heads, seq, d] with max||q|| max||k|| / sqrt(d) = score_bound (and max|q,k| = absmax).

    aligned: some keys point along some queries, so real scores approach the bound (peaked rows).
    peaked_frac: aim the fraction of low-entropy rows at this: rows rescaled, and rows that rescaling leaves flat
    turned toward one of their keys (_steer_rows), as far as the norm caps allow.
    """
    if absmax is not None and not aligned:
        nq, nk, aq, ak = split_product(score_bound * math.sqrt(d), absmax, d)
        q = rows_with(rng, family, (batch, heads, seq_q, d), nq, aq)
        k = rows_with(rng, family, (batch, heads, seq_k, d), nk, ak)
        alpha = beta = 1.0
    else:
        q = _nonzero(values(rng, family, (batch, heads, seq_q, d)))
        k = _nonzero(values(rng, family, (batch, heads, seq_k, d)))
        if aligned:
            nk = max(1, seq_k // 8)
            src = q[:, :, rng.integers(0, seq_q, size=nk)]  # (batch, heads, nk, d)
            k[:, :, rng.choice(seq_k, size=nk, replace=False)] = src * np.linalg.norm(k, axis=-1).max() / np.maximum(
                np.linalg.norm(src, axis=-1, keepdims=True), 1e-300)
        nq, nkk = np.linalg.norm(q, axis=-1).max(), np.linalg.norm(k, axis=-1).max()
        alpha, beta = _solve_pair_scale(score_bound * math.sqrt(d), nq, nkk, absmax, np.abs(q).max(), np.abs(k).max())
    v = rng.standard_normal((batch, heads, seq_k, d)) * v_scale
    causal = bool(causal and seq_q == seq_k)
    if peaked_frac is not None:
        q = _aim_peaked_frac(q * alpha, k * beta, causal, peaked_frac) / alpha
    tag = family + ("+aligned" if aligned else "") + ("+causal" if causal else "")
    return Case({"q": to_tensor(q * alpha, dtype), "k": to_tensor(k * beta, dtype), "v": to_tensor(v, dtype)},
                {"causal": causal}, tag)


def make_layernorm(rng: np.random.Generator, dtype: torch.dtype, *, rows: int, hidden: int, family: str,
                   max_mean_over_std: float, absmax: float, const_rows: int = 0, const_absmax: float = 0.0,
                   weight_absmax: float | None = None, bias_absmax: float | None = None, rms: float | None = None,
                   zmax: float | None = None) -> Case:
    """x [rows, hidden]: row i = mu_i + sigma_i z_i (z standardized); row 0 has |mu|/sigma = the target
    ratio and max|x| = absmax exactly; the other rows stay below both.

    const_rows > 0: that many rows (all of them when const_rows >= rows) are exactly constant, one at
    ±const_absmax and the others at 0.3..1 of it (sketch const_absmax; the ratio target then holds
    over the rows left, and absmax is the larger of the two targets). Row 0 stays non-constant
    unless every row is constant. Constant rows are drawn after everything else, so a case with
    them shares its other rows with the same case without them. weight_absmax / bias_absmax, when
    given, are max|weight| and max|bias| exactly (the same draws, rescaled). rms: the other rows are
    scaled down (each keeps its |mean|/std) so that the overall rms comes near it. zmax: 1-4
    channels, the same in every row, stand out of the normal rows so that a standardized row's
    largest |z| is about zmax (outlier channels: absmax/rms far above normal tails)."""
    z = values(rng, family, (rows, hidden))
    if zmax is not None and hidden >= 8:
        zmax = min(zmax, 0.95 * math.sqrt(hidden))
        k = max(1, min(int(rng.integers(1, 5)), int(hidden / zmax**2 - 1e-9)))
        amp = zmax * math.sqrt((hidden - k) / (hidden - zmax**2 * k))  # channel size giving max |z| ~ zmax
        ch = rng.choice(hidden, size=k, replace=False)
        z[:, ch] = amp * rng.uniform(0.8, 1.0, size=(rows, k)) * rng.choice([-1.0, 1.0], size=(rows, k))
        family = f"{family}+outlier-channels"
    z = z - z.mean(-1, keepdims=True)
    sd = z.std(-1, keepdims=True)  # population std
    z = np.where(sd > 0, z / np.where(sd > 0, sd, 1), rng.choice([-1.0, 1.0], size=z.shape))
    ratio = max_mean_over_std * np.concatenate([[1.0], rng.uniform(0.05, 1.0, size=rows - 1)])[:, None]  # (rows, 1)
    amax = absmax * np.concatenate([[1.0], rng.uniform(0.3, 1.0, size=rows - 1)])[:, None]
    zmax = np.abs(z).max(-1, keepdims=True)
    sigma = amax / (ratio + zmax)
    # max |mu + sigma z| is exactly amax only if the largest |z| has the sign of mu: pick the sign so.
    sign = np.sign(np.take_along_axis(z, np.abs(z).argmax(-1)[:, None], -1))
    x = sign * ratio * sigma + sigma * z
    if rms is not None and rows > 1:
        ms = (x * x).mean(-1)  # (rows,)
        c = np.ones(rows)
        want = max(rows * rms**2 - ms[0], 0.0)  # what the other rows' mean squares must sum to
        for _ in range(8):  # rescale, clip to [C_FLOOR, 1] (rows stay below row 0's absmax): a few rounds converge
            c[1:] = np.clip(c[1:] * math.sqrt(want / max((ms[1:] * c[1:] ** 2).sum(), 1e-300)), C_FLOOR, 1.0)
        x = x * c[:, None]
    perm = rng.permutation(rows)
    x = x[perm]
    w = 1.0 + 0.2 * rng.standard_normal(hidden)
    b = 0.1 * rng.standard_normal(hidden)
    if weight_absmax is not None:
        w *= weight_absmax / max(np.abs(w).max(), 1e-300)
    if bias_absmax is not None:
        b *= bias_absmax / max(np.abs(b).max(), 1e-300)
    shape = _leading(rng, rows)
    if const_rows > 0 and const_absmax > 0:
        k = min(int(const_rows), rows)
        pool = np.arange(rows) if k >= rows else np.flatnonzero(perm != 0)  # row 0 (the ratio target) stays
        idx = rng.choice(pool, size=k, replace=False)
        c = const_absmax * np.concatenate([[1.0], rng.uniform(0.3, 1.0, size=k - 1)]) * rng.choice([-1.0, 1.0], size=k)
        x[idx] = c[:, None]  # exactly constant after the cast too (one value per row)
        family = f"{family}+const-rows"
    return Case({"x": to_tensor(x.reshape(*shape, hidden), dtype), "weight": to_tensor(w, dtype),
                 "bias": to_tensor(b, dtype)}, {}, family)


def _destination(lat: np.ndarray, lon: np.ndarray, sep_deg: np.ndarray, bearing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Point at angular distance sep_deg along bearing from (lat, lon), float64 great-circle formula."""
    p1, l1, dl, th = np.radians(lat), np.radians(lon), np.radians(sep_deg), bearing
    p2 = np.arcsin(np.clip(np.sin(p1) * np.cos(dl) + np.cos(p1) * np.sin(dl) * np.cos(th), -1, 1))
    l2 = l1 + np.arctan2(np.sin(th) * np.sin(dl) * np.cos(p1), np.cos(dl) - np.sin(p1) * np.sin(p2))
    return np.degrees(p2), (np.degrees(l2) + 180.0) % 360.0 - 180.0


def make_geodesic(rng: np.random.Generator, dtype: torch.dtype, *, n: int, family: str, min_sep_deg: float,
                  median_sep_deg: float, near_origin: bool = False) -> Case:
    """n pairs whose float64 separations have the given min and (approximately) median.

    near_origin: start points within 1e-3 degrees of (0, 0), where float32 degrees resolve 1e-10:
    the only way tiny separations survive the cast to float32.
    """
    med = max(median_sep_deg, min_sep_deg)
    z = rng.normal(0.0, 0.8, size=n)
    z -= np.sort(z)[(n - 1) // 2]  # lower median of z is 0: the lower median of sep is `med`
    sep = np.minimum(med * np.exp(z), 180.0)
    sep = np.maximum(sep, min_sep_deg)
    sep[int(np.argmin(sep))] = min_sep_deg
    if family == "antipodal":
        sep = 180.0 - np.minimum(sep, 180.0)  # distance from the antipode instead
    if near_origin:
        lat1, lon1 = rng.uniform(-1e-3, 1e-3, n), rng.uniform(-1e-3, 1e-3, n)
    else:
        lat1 = np.degrees(np.arcsin(rng.uniform(-0.99, 0.99, n)))  # uniform on the sphere, off the poles
        lon1 = rng.uniform(-180.0, 180.0, n)
    lat2, lon2 = _destination(lat1, lon1, sep, rng.uniform(0, 2 * math.pi, n))
    t = lambda a: to_tensor(a, torch.float32)  # noqa: E731  geodesic is float32 degrees
    tag = family + ("+near-origin" if near_origin else "")
    return Case({"lat1": t(lat1), "lon1": t(lon1), "lat2": t(lat2), "lon2": t(lon2)}, {}, tag)


def make_matmul(rng: np.random.Generator, dtype: torch.dtype, *, m: int, k: int, n: int, family: str,
                out_bound: float, absmax: float | None = None, aligned: bool = False) -> Case:
    """a [m, k], b [k, n] with max row norm(a) * max col norm(b) = out_bound (and max|a,b| = absmax).

    aligned: a column of b points along a row of a, so |a @ b| actually reaches the bound.
    """
    if absmax is not None and not aligned:
        na, nb, aa, ab = split_product(out_bound, absmax, k)
        a = rows_with(rng, family, (m, k), na, aa)
        b = rows_with(rng, "normal" if family == "outlier" else family, (n, k), nb, ab).T  # columns of b
        alpha = beta = 1.0
    else:
        a = _nonzero(values(rng, family, (m, k)))
        b = _nonzero(values(rng, "normal" if family == "outlier" else family, (k, n)))
        if aligned:
            b[:, int(rng.integers(n))] = a[int(rng.integers(m))]
        ra, cb = np.linalg.norm(a, axis=1).max(), np.linalg.norm(b, axis=0).max()
        alpha, beta = _solve_pair_scale(out_bound, ra, cb, absmax, np.abs(a).max(), np.abs(b).max())
    return Case({"a": to_tensor(a * alpha, dtype), "b": to_tensor(b * beta, dtype)}, {},
                family + ("+aligned" if aligned else ""))


# ----------------------------------------------------------------------------- sweeps

# Boundary ranges of the fault-driving features: (lo, hi) for float16, and for the wider-exponent
# dtypes (bfloat16, float32) where overflow sits near 3e38 and squares overflow near 1.8e19.
BOUNDARY_RANGES: dict[str, dict[str, tuple[tuple[float, float], tuple[float, float]]]] = {
    "rmsnorm": {"absmax": ((1e-4, 1e4), (1e-4, 1e21))},  # fp16: x*x overflows past 256
    "softmax": {"max": ((1e-1, 1e4), (1e-1, 1e4)), "max_row_range": ((1e-2, 1e4), (1e-2, 1e4))},  # naive exp: 11.1 / 88.7
    "rope": {"max_pos": ((1.0, 2.0**21), (1.0, 2.0**25)), "absmax": ((1e-2, 1e4), (1e-2, 1e4))},  # fp32 ints exact to 2^24
    "attention": {"score_bound": ((1e-1, 1e6), (1e-1, 1e6))},  # fp16 scores overflow at 65504
    # one-pass var cancels past ~4e3 (fp32). Constant rows: exact fp32 means for fp16/bf16 (NaN only
    # once c^2 overflows fp32 past 1.8e19), rounded ones for some fp32 rows; fp16 up to its max.
    "layernorm": {"max_mean_over_std": ((1.0, 1e6), (1.0, 1e8)), "const_absmax": ((1e-2, 6e4), (1e-2, 1e24))},
    "geodesic": {"min_sep_deg": ((1e-9, 1.0), (1e-9, 1.0)), "median_sep_deg": ((1e-9, 180.0), (1e-9, 180.0))},
    "matmul": {"out_bound": ((1e-9, 1e6), (1e-42, 1e40))},  # fp16: overflow 65504, subnormals < 6e-5
}


# Widths the sweeps draw from, shared by the ordinary cases (_case) and the zero / tiny ones (_tiny_case)
# so that both cover the same shapes: odd sizes (127, 33) cross block boundaries. Listed once here because
# a width added to one sweep and not the other would leave zero inputs unseen at that width.
RMSNORM_HIDDEN = (32, 64, 127, 256, 512, 1024)
LAYERNORM_HIDDEN = (32, 64, 127, 384, 768, 1024)  # BERT / GPT-2 widths
SOFTMAX_N = (8, 33, 128, 512, 1024)
HEAD_DIMS = (16, 32, 64, 128)  # rope and attention
SOFTMAX_MASKS = ("none", "none", "causal", "padding")  # unmasked half the time


def _range(op: str, feature: str, dtype: str) -> tuple[float, float]:
    narrow, wide = BOUNDARY_RANGES[op][feature]
    return narrow if dtype == "float16" else wide


def _pick(rng: np.random.Generator, options: tuple[Any, ...] | list[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


def _log_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(round(loguniform(rng, lo, hi)))


# Share of layernorm sweep cases with exactly constant rows (sketch const_absmax > 0).
CONST_ROWS_FRAC = 0.25


def _const_rows(rng: np.random.Generator, dtype: str, rows: int, boundary: bool) -> tuple[int, float]:
    """(constant rows, their |c|) of a layernorm sweep case: (0, 0) for most; otherwise every row
    (half of them) or 1..rows-1 rows, |c| log-uniform over the boundary range or absmax's range."""
    if rng.random() >= CONST_ROWS_FRAC:
        return 0, 0.0
    k = rows if rows == 1 or rng.random() < 0.5 else int(rng.integers(1, rows))
    lo, hi = _range("layernorm", "const_absmax", dtype) if boundary else (1e-2, 1e4 if dtype == "float16" else 1e6)
    return k, loguniform(rng, lo, hi)


def _case(op: str, dtype: str, t: torch.dtype, rng: np.random.Generator, boundary: bool,
          extra: np.random.Generator | None = None) -> Case:
    """One case; `boundary` draws the fault-driving features from BOUNDARY_RANGES, otherwise from
    realistic ranges with every input family (a build without a profile still reaches faults).
    `extra`: a second stream for choices added later (layernorm's constant rows), so that the
    cases drawn before them keep their values."""
    fam = _pick(rng, VALUE_FAMILIES)
    lo_hi = (lambda f: _range(op, f, dtype)) if boundary else None
    if op == "rmsnorm":
        lo, hi = lo_hi("absmax") if lo_hi else (1e-3, 1e3)
        return make_rmsnorm(rng, t, rows=_log_int(rng, 1, MAX_ROWS), hidden=_pick(rng, RMSNORM_HIDDEN),
                            family=fam, absmax=loguniform(rng, lo, hi))
    if op == "softmax":
        rows, n = _log_int(rng, 1, MAX_ROWS), _pick(rng, SOFTMAX_N)
        lo, hi = lo_hi("max") if lo_hi else (1e-1, 1e2)
        top = loguniform(rng, lo, hi) * (1 if rng.random() < 0.75 else -1)
        rlo, rhi = lo_hi("max_row_range") if lo_hi else (1e-2, 1e2)
        mask = _pick(rng, SOFTMAX_MASKS)
        masked = int(rng.integers(1, max(rows // 4, 1) + 1)) if rng.random() < (0.3 if boundary else 0.15) else 0
        return make_softmax(rng, t, rows=rows, n=n, family=fam, max=top, max_row_range=loguniform(rng, rlo, rhi),
                            mask=mask, masked_rows=masked)
    if op == "rope":
        seq, d = _log_int(rng, 1, MAX_ROWS), _pick(rng, HEAD_DIMS)
        plo, phi = lo_hi("max_pos") if lo_hi else (1.0, 2.0**17)
        alo, ahi = lo_hi("absmax") if lo_hi else (1e-2, 1e2)
        base = 10000.0 if boundary or rng.random() < 0.7 else 500000.0  # Llama 2 / Llama 3 bases
        return make_rope(rng, t, seq=seq, heads=int(rng.integers(1, 5)), d=d, family=fam,
                         max_pos=max(int(loguniform(rng, plo, phi)), seq - 1), absmax=loguniform(rng, alo, ahi), base=base)
    if op == "attention":
        seq_k = _log_int(rng, 1, MAX_SEQ)
        seq_q = seq_k if rng.random() < 0.6 else _pick(rng, (1, max(seq_k // 2, 1)))
        lo, hi = lo_hi("score_bound") if lo_hi else (1e-1, 1e3)
        return make_attention(rng, t, batch=int(rng.integers(1, 3)), heads=int(rng.integers(1, 5)), seq_q=seq_q,
                              seq_k=seq_k, d=_pick(rng, HEAD_DIMS), family=fam, score_bound=loguniform(rng, lo, hi),
                              causal=bool(rng.random() < 0.5), aligned=bool(rng.random() < 0.3))
    if op == "layernorm":
        lo, hi = lo_hi("max_mean_over_std") if lo_hi else (1e-2, 1e4)
        amax = loguniform(rng, 1e-1, 1e4 if dtype == "float16" else 1e6)
        rows = _log_int(rng, 1, MAX_ROWS)
        k, c = _const_rows(extra if extra is not None else rng, dtype, rows, boundary)
        return make_layernorm(rng, t, rows=rows, hidden=_pick(rng, LAYERNORM_HIDDEN), family=fam,
                              max_mean_over_std=loguniform(rng, lo, hi), absmax=amax, const_rows=k, const_absmax=c)
    if op == "geodesic":
        gfam = _pick(rng, ("random", "near-identical", "antipodal", "random"))
        lo, hi = lo_hi("min_sep_deg") if lo_hi else ((1e-9, 1e-2) if gfam == "near-identical" else (1e-3, 10.0))
        mn = loguniform(rng, lo, hi)
        mlo, mhi = lo_hi("median_sep_deg") if lo_hi else (mn, 180.0)
        med = max(loguniform(rng, max(mlo, mn), max(mhi, mn * 1.0001)), mn)
        return make_geodesic(rng, t, n=_log_int(rng, 8, MAX_POINTS), family=gfam, min_sep_deg=mn, median_sep_deg=med,
                             near_origin=gfam != "antipodal" and mn < 1e-4 and rng.random() < 0.5)
    if op == "matmul":
        lo, hi = lo_hi("out_bound") if lo_hi else (1e-3, 1e4)
        return make_matmul(rng, t, m=_log_int(rng, 1, MAX_MATMUL), k=_log_int(rng, 1, MAX_MATMUL),
                           n=_log_int(rng, 1, MAX_MATMUL), family=fam, out_bound=loguniform(rng, lo, hi),
                           aligned=bool(rng.random() < 0.3))
    raise CatalogError(f"no generator for operator {op!r}")


# Sweep cases whose input is all zero or of tiny magnitude (_tiny_case), for the ops where such
# inputs are common at init: a PEFT LoRA's zero-initialised B (every call of the adapter is a matmul with a zero
# operand), uniform or near-uniform logits (a fresh router, zeroed attention scores), zero rows. Their sketches
# bin far below anything the other cases reach (a feature of 0 is bin 0, 1e-9 is bin ~240), so without them the
# matcher answered these calls from the nearest fault cells (fp16 subnormal products, masked rows: p 0.3-1.0)
# though the twins find no fault. Every TINY_EVERY-th case (from index TINY_EVERY // 2), alternately all zero and
# tiny: by index rather than by a draw, so that every sweep of TINY_EVERY * 2 cases or more has both (a draw left
# some (op, dtype) sweeps without an all-zero softmax). Drawn from a stream of its own: the other cases keep theirs.
TINY_EVERY = 16
TINY_OPS = ("softmax", "matmul", "attention", "rmsnorm", "layernorm")  # rope bins on positions, geodesic on angles


def _tiny_case(op: str, t: torch.dtype, rng: np.random.Generator, zero: bool) -> Case:
    """A case with an all-zero input (`zero`) or one scaled to max|x| in 1e-6..1e-1: matmul a zero or tiny operand
    (b most often: the zero-initialised weight), softmax zero, near-zero or near-constant logits, attention zero
    or tiny queries or keys, rmsnorm / layernorm zero or tiny rows."""
    fam = _pick(rng, VALUE_FAMILIES)
    scale = 0.0 if zero else loguniform(rng, 1e-6, 1e-1)
    tag = f"{fam}+{'zero' if scale == 0.0 else 'tiny'}"

    def shrink(x: torch.Tensor) -> torch.Tensor:  # max|x| becomes scale (exact zeros for 0: no -0.0 products)
        if scale == 0.0:
            return torch.zeros_like(x)
        a = x.double().numpy()
        return to_tensor(a * (scale / max(float(np.abs(a).max()), 1e-300)), x.dtype)

    if op == "matmul":
        c = make_matmul(rng, t, m=_log_int(rng, 1, MAX_MATMUL), k=_log_int(rng, 1, MAX_MATMUL),
                        n=_log_int(rng, 1, MAX_MATMUL), family=fam, out_bound=loguniform(rng, 1e-3, 1e4))
        which = _pick(rng, ("a", "b", "b", "ab"))
        return Case({k: shrink(v) if k in which else v for k, v in c.inputs.items()}, {}, f"{tag}-{which}")
    if op == "softmax":
        rows, n = _log_int(rng, 1, MAX_ROWS), _pick(rng, SOFTMAX_N)
        z = _nonzero(values(rng, fam, (rows, n)))
        x = z * (scale / np.abs(z).max())
        if not zero and rng.random() < 0.25:  # near-constant rows around an offset: the softmax of x + c is x's
            x = x + loguniform(rng, 1e-3, 10.0) * (1 if rng.random() < 0.5 else -1)
            tag += "+offset"
        mask = _pick(rng, SOFTMAX_MASKS)
        x = np.where(_mask(rng, mask, rows, n, 0), -np.inf, x)
        return Case({"x": to_tensor(x, t)}, {}, tag + ("" if mask == "none" else f"+{mask}"))
    if op == "attention":
        seq_k = _log_int(rng, 1, MAX_SEQ)
        c = make_attention(rng, t, batch=int(rng.integers(1, 3)), heads=int(rng.integers(1, 5)), seq_q=seq_k,
                           seq_k=seq_k, d=_pick(rng, HEAD_DIMS), family=fam,
                           score_bound=loguniform(rng, 1e-1, 1e2), causal=bool(rng.random() < 0.5))
        which = _pick(rng, ("q", "k", "qk"))
        return Case({k: shrink(v) if k in which else v for k, v in c.inputs.items()}, c.params, f"{tag}-{which}")
    rows = _log_int(rng, 1, MAX_ROWS)
    if op == "rmsnorm":
        c = make_rmsnorm(rng, t, rows=rows, hidden=_pick(rng, RMSNORM_HIDDEN), family=fam, absmax=1.0)
    else:
        c = make_layernorm(rng, t, rows=rows, hidden=_pick(rng, LAYERNORM_HIDDEN), family=fam,
                           max_mean_over_std=loguniform(rng, 1e-2, 10.0), absmax=1.0)
    return Case({k: shrink(v) if k == "x" else v for k, v in c.inputs.items()}, c.params, tag)


def _sweep(op: str, dtype: str | torch.dtype, n_cases: int, seed: int, boundary: bool, salt: int) -> list[Case]:
    name, t = _check(op, dtype)
    if n_cases < 0:
        raise ValueError(f"n_cases must be >= 0, got {n_cases}")
    out = []
    for i in range(n_cases):
        if op in TINY_OPS and i % TINY_EVERY == TINY_EVERY // 2:
            c = _tiny_case(op, t, case_rng(seed, op, i, salt + 32), zero=(i // TINY_EVERY) % 2 == 0)
        else:
            c = _case(op, name, t, case_rng(seed, op, i, salt), boundary, case_rng(seed, op, i, salt + 16))
        if boundary:
            c.family = f"boundary:{c.family}"
        out.append(c)
    return out


def default_sweep(op: str, dtype: str | torch.dtype, n_cases: int, seed: int) -> list[Case]:
    """Cases for a build without a profile: every input family (normal, heavy tails, outlier
    channels, uniform; masks; long positions; near-identical and antipodal points), realistic shapes
    and log-uniform scales wide enough to cross the common fault boundaries."""
    return _sweep(op, dtype, n_cases, seed, boundary=False, salt=1)


def boundary_sweep(op: str, dtype: str | torch.dtype, n_cases: int, seed: int) -> list[Case]:
    """Cases that push the op's region features (catalog region_features) log-uniformly across
    BOUNDARY_RANGES: toward and past each fault boundary of the dtype."""
    return _sweep(op, dtype, n_cases, seed, boundary=True, salt=2)


GENERATORS: dict[str, Callable[..., Case]] = {
    "rmsnorm": make_rmsnorm, "softmax": make_softmax, "rope": make_rope, "attention": make_attention,
    "layernorm": make_layernorm, "geodesic": make_geodesic, "matmul": make_matmul,
}
