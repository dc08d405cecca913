"""Fit captured sketch distributions and sample synthetic inputs that reproduce them.

    python -c "from optwin.ingest import read_profile, fit_profile, sample_inputs; f = fit_profile(read_profile('profiles/minilm')); print(f.summary())"

Model, per (op, variant, dtype):

* each feature gets a marginal: *discrete* (shapes, counts, flags: the empirical distribution),
  *log* (non-negative magnitudes: log x, with a point mass at 0) or *signed* (softmax max/min:
  asinh x). A continuous marginal's body is the smoothed empirical quantile function of the
  transformed values (captured distributions are multi-modal: different layers); above the 90th
  percentile a generalized Pareto tail (scipy genpareto on the log-scale exceedances, i.e. a
  power-law tail in x) takes over when there are at least 20 exceedances, so samples extrapolate
  the tail instead of repeating the largest value seen. A Student-t fit to the transformed values
  is kept alongside (df, loc, scale and its KS distance) to report how heavy the tail is.
* a Gaussian copula ties the features together (correlation of normal scores), so the sampled
  feature vectors keep the captured dependence: outlier-channel structure (absmax vs rms vs
  max_row_rms), layer shapes vs magnitudes (k vs out_bound), masks vs row counts.

`sample_inputs(op, dtype, fitted, n_cases, seed)` draws feature vectors and builds tensors with the
generate.make_<op> constructors, which hit the fault-driving features exactly (before the cast to
dtype). Shapes that are not region features are capped for the CPU twin (rows/m/n <= 64, batch <= 2,
heads <= 4, geodesic n <= 512); region-feature shapes (hidden, n, d, seq_k, k) are kept. Attention
keeps causal and, for causal or self-attention calls, seq_q == seq_k (up to 2048 tokens, with fewer
batches and heads); cross-attention caps seq_q at 64.
`peaked_frac` (the fraction of low-entropy rows): attention aims at it by rescaling query rows within
the drawn norms, then turning rows toward a key where growing leaves them flat (short rows of few keys;
generate._aim_peaked_frac); softmax by the spread of each row's scores, apart from
its range (generate._softmax_rows: a finite mask value such as finfo.min or -1e9 widens the range,
not the scores), and hits min_row_max as well.
Not aimed at: attention's `max_score` (the largest q.k): it follows from the drawn norms and
directions, so a profile-sample build places attention's nonfinite cells where its samples land, not
where the captured calls were (the default sweep's aligned and large-score families cover the range).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from optwin.catalog import CATALOG, operator
from optwin.errors import ProfileError
from optwin.ingest.generate import (
    MAX_POINTS,
    Case,
    _check,
    case_rng,
    make_attention,
    make_geodesic,
    make_layernorm,
    make_matmul,
    make_rmsnorm,
    make_rope,
    make_softmax,
    seed_words,
)
from optwin.ingest.sketch import SIGNED_FEATURES, SKETCH_FEATURES

if TYPE_CHECKING:
    import polars as pl

    from optwin.ingest.profile import Profile

# Shapes, counts and flags: always discrete.
DISCRETE: frozenset[str] = frozenset({"numel", "rows", "nonfinite", "hidden", "n", "seq", "heads", "d", "batch", "seq_q",
                                      "seq_k", "causal", "m", "k", "masked_rows", "base"})
TAIL_Q = 0.9  # the GPD tail starts at this quantile
SMOOTH_H = 0.1  # bandwidth of the empirical copula, in normal-score units
MIN_TAIL = 20  # exceedances needed to fit a tail
CAP_ROWS = 64
CAP_SELF_SEQ = 2048  # causal / self-attention samples keep seq_q == seq_k up to this many tokens
# Attention samples drop batch, then heads, while batch*heads*seq_q*seq_k exceeds this. Not a hard
# bound: one head of a capped self-attention is CAP_SELF_SEQ**2 = 4.2M scores (34 MB of float64),
# and cross-attention's CAP_ROWS * seq_k grows with seq_k.
MAX_SCORES = 2**21

# Region features the constructors do not aim at (see the module docstring).
UNTARGETED_FEATURES: frozenset[str] = frozenset({"max_score", "rms_sep_deg"})


@dataclass
class FeatureFit:
    """Marginal distribution of one feature (see module docstring)."""

    name: str
    kind: str  # "discrete" | "log" | "signed"
    values: np.ndarray  # sorted: raw values (discrete) or transformed non-zero values (log/signed)
    p_zero: float = 0.0  # log kind: mass at exactly 0
    t_params: tuple[float, float, float] | None = None  # Student-t (df, loc, scale) on the transformed scale
    t_ks: float | None = None  # KS distance of that t fit to the data
    tail: tuple[float, float, float] | None = None  # (threshold, xi, scale) of the GPD tail, transformed scale

    def ppf(self, u: np.ndarray) -> np.ndarray:
        """Quantile function: u in (0, 1) -> feature values."""
        u = np.clip(np.asarray(u, dtype=np.float64), 1e-12, 1 - 1e-12)
        v = self.values
        if self.kind == "discrete":
            return v[np.minimum((u * len(v)).astype(np.int64), len(v) - 1)]
        out = np.zeros_like(u)
        live = u >= self.p_zero  # below p_zero: the point mass at 0 (log kind)
        w = (u[live] - self.p_zero) / max(1.0 - self.p_zero, 1e-12)  # quantile within the non-zero part
        if len(v) == 0:
            return out
        y = np.interp(w, (np.arange(len(v)) + 0.5) / len(v), v)
        if self.tail is not None:
            thr, xi, scale = self.tail
            hi = w > TAIL_Q
            from scipy.stats import genpareto

            y[hi] = thr + genpareto.ppf((w[hi] - TAIL_Q) / (1 - TAIL_Q), xi, loc=0.0, scale=scale)
        out[live] = np.exp(y) if self.kind == "log" else np.sinh(y)
        return out

    def summary(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "n": int(len(self.values))}
        if self.kind == "discrete":
            uniq, cnt = np.unique(self.values, return_counts=True)
            d["values"] = {float(a): int(b) for a, b in zip(uniq[:12], cnt[:12])}
        else:
            d.update(p_zero=self.p_zero, t=self.t_params, t_ks=self.t_ks, tail=self.tail)
            if len(self.values):
                back = np.exp if self.kind == "log" else np.sinh
                d["quantiles"] = {q: float(back(np.quantile(self.values, q))) for q in (0.05, 0.5, 0.95)}
        return d


def _fit_feature(name: str, x: np.ndarray) -> FeatureFit:
    x = x[np.isfinite(x)]
    uniq = np.unique(x)
    if name in DISCRETE or len(uniq) <= 3:
        return FeatureFit(name, "discrete", np.sort(x))
    if name in SIGNED_FEATURES or (x < 0).any():
        kind, y, p0 = "signed", np.sort(np.arcsinh(x)), 0.0
    else:
        kind, p0 = "log", float((x == 0).mean())
        y = np.sort(np.log(x[x > 0]))
    fit = FeatureFit(name, kind, y, p_zero=p0)
    if len(y) >= 8 and np.ptp(y) > 0:
        from scipy import stats

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df, loc, scale = stats.t.fit(y)
            fit.t_params = (float(df), float(loc), float(scale))
            fit.t_ks = float(stats.kstest(y, "t", args=fit.t_params).statistic)
            thr = float(np.quantile(y, TAIL_Q))
            exc = y[y > thr] - thr
            if len(exc) >= MIN_TAIL and np.ptp(exc) > 0:
                xi, _, sc = stats.genpareto.fit(exc, floc=0.0)
                if np.isfinite(xi) and np.isfinite(sc) and sc > 0:
                    fit.tail = (thr, float(min(xi, 0.5)), float(sc))  # xi capped: finite-variance tails only
    return fit


@dataclass
class OpFit:
    """Fitted joint distribution of one (op, variant, dtype)'s sketches."""

    op: str
    variant: str
    dtype: str
    n: int
    features: dict[str, FeatureFit]
    corr: np.ndarray  # copula correlation, features in SKETCH_FEATURES[op] order
    structure: dict[str, Any] = field(default_factory=dict)
    scores: np.ndarray | None = None  # (n, features) normal scores of the captured rows
    # Attention: which captured rows have seq_q == seq_k (self-attention). Ties are ranked at random
    # per feature, so the copula alone draws the two apart; draw() sets them equal again.
    same_seq: np.ndarray | None = None

    def draw(self, rng: np.random.Generator, n: int, method: str = "empirical") -> list[dict[str, float]]:
        """n feature vectors. method "empirical": smoothed empirical copula (a captured row's normal
        scores plus N(0, h^2) noise, rescaled to unit variance): keeps mixtures of layers and hard
        constraints (min <= median) that one correlation matrix cannot; "gaussian": the Gaussian
        copula. Vectors violating an op's feasibility constraints are redrawn (up to 20 rounds)."""
        from scipy.special import ndtr

        names = list(self.features)
        out = np.empty((n, len(names)))
        src = np.full(n, -1)  # captured row each vector was drawn around (-1: Gaussian copula)
        todo = np.arange(n)
        for _ in range(20):
            k = len(todo)
            if method == "gaussian" or self.scores is None or len(self.scores) < 3:
                z = rng.multivariate_normal(np.zeros(len(names)), self.corr, size=k, method="eigh")
                src[todo] = -1
            else:
                src[todo] = rng.integers(len(self.scores), size=k)
                rows = self.scores[src[todo]]
                z = (rows + SMOOTH_H * rng.standard_normal(rows.shape)) / math.sqrt(1 + SMOOTH_H**2)
            u = ndtr(z)
            out[todo] = np.column_stack([self.features[nm].ppf(u[:, j]) for j, nm in enumerate(names)])
            ok = _feasible(self.op, {nm: out[todo, j] for j, nm in enumerate(names)})
            todo = todo[~ok]
            if not len(todo):
                break
        if self.same_seq is not None and len(self.same_seq):
            same = np.where(src >= 0, self.same_seq[np.maximum(src, 0)], rng.random(n) < self.same_seq.mean())
            out[same, names.index("seq_q")] = out[same, names.index("seq_k")]
        return [dict(zip(names, map(float, row))) for row in out]

    def summary(self) -> dict[str, Any]:
        return {"n": self.n, "structure": self.structure, "features": {k: f.summary() for k, f in self.features.items()}}


def _feasible(op: str, f: dict[str, np.ndarray]) -> np.ndarray:
    """Which drawn feature vectors some input can have (relations every real sketch satisfies)."""
    tol = 1 + 1e-6
    ok = np.ones(len(next(iter(f.values()))), dtype=bool)
    if op == "rmsnorm":
        ok &= (f["max_row_rms"] <= f["absmax"] * tol) & (f["absmax"] <= np.sqrt(f["hidden"]) * f["max_row_rms"] * tol)
    elif op == "geodesic":
        ok &= (f["min_sep_deg"] <= f["median_sep_deg"] * tol) & (f["median_sep_deg"] <= f["max_sep_deg"] * tol)
    elif op == "softmax":
        ok &= (f["min"] <= f["max"]) & (f["max_row_range"] <= (f["max"] - f["min"]) * tol + 1e-12)
        ok &= f["masked_rows"] <= f["rows"]
    elif op == "attention":
        ok &= f["score_bound"] <= f["absmax"] ** 2 * np.sqrt(f["d"]) * tol
    elif op == "matmul":
        ok &= f["out_bound"] <= f["absmax"] ** 2 * f["k"] * tol
    elif op == "layernorm":
        ok &= f["const_absmax"] <= f["absmax"] * tol
    return ok


def _normal_scores(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rank-based normal scores, ties broken at random (discrete features)."""
    from scipy.special import ndtri

    order = np.lexsort((rng.random(len(x)), x))
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    return ndtri((ranks + 0.5) / len(x))


def _structure(op: str, cols: dict[str, np.ndarray]) -> dict[str, Any]:
    """Human-readable structure: outlier channels, masks, positions."""
    q = lambda v: [float(a) for a in np.quantile(v, [0.05, 0.5, 0.95])] if len(v) else []  # noqa: E731
    out: dict[str, Any] = {}
    with np.errstate(all="ignore"):
        if "absmax" in cols and "rms" in cols:
            ratio = cols["absmax"] / np.where(cols["rms"] > 0, cols["rms"], np.nan)
            out["absmax_over_rms_q05_50_95"] = q(ratio[np.isfinite(ratio)])  # >> 3: outlier channels
    if op == "softmax":
        out["calls_with_masked_rows"] = float((cols["masked_rows"] > 0).mean())
        out["masked_frac_mean"] = float(cols["masked_frac"].mean())
    if op == "rope":
        out["max_pos_q05_50_95"] = q(cols["max_pos"])
    if op == "attention":
        out["causal_frac"] = float(cols["causal"].mean())
    return out


def fit_op(op: str, variant: str, dtype: str, frame: "pl.DataFrame", seed: int = 0) -> OpFit:
    """Fit one (op, variant, dtype) from a sketch table's rows (feature columns of that op)."""
    names = SKETCH_FEATURES[op]
    data = frame.select(list(names)).drop_nulls().to_numpy().astype(np.float64)  # (n, features)
    data = data[np.isfinite(data).all(1)]
    if len(data) == 0:
        raise ProfileError(f"{op}/{variant}/{dtype}: no usable sketches to fit")
    cols = {nm: data[:, j] for j, nm in enumerate(names)}
    feats = {nm: _fit_feature(nm, cols[nm]) for nm in names}
    rng = np.random.default_rng(seed)
    z = None
    if len(data) >= 3:
        z = np.column_stack([_normal_scores(cols[nm], rng) for nm in names])
        with np.errstate(all="ignore"):
            c = np.corrcoef(z, rowvar=False)
        c = np.nan_to_num(np.atleast_2d(c), nan=0.0)
        np.fill_diagonal(c, 1.0)
        # Nearest positive semi-definite matrix (eigenvalue clipping) and a touch of ridge.
        w, v = np.linalg.eigh(c)
        c = (v * np.clip(w, 1e-6, None)) @ v.T
        d = np.sqrt(np.diag(c))
        c = c / np.outer(d, d)
    else:
        c = np.eye(len(names))
    same = cols["seq_q"] == cols["seq_k"] if op == "attention" else None
    return OpFit(op, variant, dtype, len(data), feats, c, _structure(op, cols), z, same)


@dataclass
class Fitted:
    """Fits of every (op, variant, dtype) of a profile or sketch log."""

    fits: dict[tuple[str, str, str], OpFit]
    source: str = ""

    def for_op(self, op: str, dtype: str | None = None) -> list[OpFit]:
        """Fits of op for dtype; if that dtype was never captured, the op's fits of any dtype."""
        mine = [f for (o, _, d), f in self.fits.items() if o == op and (dtype is None or d == dtype)]
        return mine or [f for (o, _, _), f in self.fits.items() if o == op]

    def summary(self) -> dict[str, Any]:
        return {f"{o}/{v}/{d}": f.summary() for (o, v, d), f in self.fits.items()}


def fit_sketches(frame: "pl.DataFrame", source: str = "", seed: int = 0) -> Fitted:
    """Fit every (op, variant, dtype) present in a sketch table (profile or read_sketch_log frame)."""
    import polars as pl

    fits: dict[tuple[str, str, str], OpFit] = {}
    keys = sorted(frame.select("op", "variant", "dtype").unique().rows())
    for op, variant, dtype in keys:
        if op not in CATALOG:
            continue
        sub = frame.filter((pl.col("op") == op) & (pl.col("variant") == variant) & (pl.col("dtype") == dtype))
        fits[(op, variant, dtype)] = fit_op(op, variant, dtype, sub, seed)
    return Fitted(fits, source)


def fit_profile(profile: "Profile | str", seed: int = 0) -> Fitted:
    """Fit a profile (a Profile or a profile directory)."""
    from optwin.ingest.profile import Profile, read_profile

    p = profile if isinstance(profile, Profile) else read_profile(profile)
    return fit_sketches(p.sketches, source=str(p.path), seed=seed)


# ----------------------------------------------------------------------------- sampling


def _i(v: float, lo: int = 1, hi: int | None = None) -> int:
    n = max(int(round(v)), lo)
    return min(n, hi) if hi is not None else n


def _build(op: str, t: torch.dtype, f: dict[str, float], rng: np.random.Generator, family: str) -> Case:
    """Tensors whose sketch hits the drawn features (the region features exactly, before the cast)."""
    fam = "normal"
    if op == "rmsnorm":
        return make_rmsnorm(rng, t, rows=_i(f["rows"], hi=CAP_ROWS), hidden=_i(f["hidden"]), family=fam,
                            absmax=max(f["absmax"], 1e-30), max_row_rms=f["max_row_rms"], weight_absmax=max(f["weight_absmax"], 1e-30),
                            rms=f["rms"])
    if op == "softmax":
        rows = _i(f["rows"], hi=CAP_ROWS)
        masked = min(_i(f["masked_rows"], lo=0), rows)
        full_frac = masked / rows
        mask = "padding" if f["masked_frac"] > full_frac + 0.02 else "none"
        return make_softmax(rng, t, rows=rows, n=_i(f["n"]), family=fam, max=f["max"],
                            max_row_range=max(f["max_row_range"], 0.0), mask=mask, masked_rows=masked,
                            # Clipped into [min, max], not redrawn: captured calls often have
                            # min_row_max == max or == min (one row; rows at a finite mask value),
                            # and rejecting the jittered draws past them would thin those modes.
                            min_row_max=min(max(f["min_row_max"], f["min"]), f["max"]), min=f["min"], rms=f["rms"],
                            peaked_frac=f["peaked_frac"])
    if op == "rope":
        return make_rope(rng, t, seq=_i(f["seq"], hi=CAP_ROWS), heads=_i(f["heads"], hi=4), d=2 * _i(f["d"] / 2),
                         family=fam, max_pos=_i(f["max_pos"], lo=0), absmax=max(f["absmax"], 1e-30), base=max(f["base"], 2.0))
    if op == "attention":
        seq_k, seq_q = _i(f["seq_k"]), _i(f["seq_q"])
        # The twins' causal mask is top-left aligned (sdpa's is_causal: query i sees keys 0..i), so a
        # causal call with fewer queries than keys would see only the first keys: causal calls (and
        # self-attention, seq_q == seq_k) keep every query, up to CAP_SELF_SEQ; cross-attention keeps
        # seq_k and at most CAP_ROWS queries (rows are independent there).
        causal = f["causal"] >= 0.5
        if causal or seq_q == seq_k:  # non-causal too: a 32k-token encoder call left whole is ~8 GB a case
            seq_q = seq_k = min(seq_k, CAP_SELF_SEQ)
        if seq_q != seq_k:
            seq_q = min(seq_q, CAP_ROWS)
        batch, heads = _i(f["batch"], hi=2), _i(f["heads"], hi=4)
        while batch * heads * seq_q * seq_k > MAX_SCORES and batch * heads > 1:  # the twin's float64 scores
            batch, heads = (1, heads) if batch > 1 else (batch, heads - 1)
        return make_attention(rng, t, batch=batch, heads=heads, seq_q=seq_q, seq_k=seq_k,
                              d=_i(f["d"]), family=fam, score_bound=max(f["score_bound"], 1e-30),
                              absmax=max(f["absmax"], 1e-30), causal=causal, v_scale=max(f["v_absmax"], 1e-30) / 3.0,
                              peaked_frac=f["peaked_frac"])
    if op == "layernorm":
        # A profile holds the largest constant row only: one such row, or every row when no row varies.
        rows = _i(f["rows"], hi=CAP_ROWS)
        ca = max(f["const_absmax"], 0.0)
        hidden = _i(f["hidden"], lo=2)
        # absmax/rms beyond what normal rows' own tails give: outlier channels (shared by every row),
        # sized so the absmax row alone has ~0.8 of the ratio (the rms aim shrinks the other rows).
        tails = 1.5 * math.sqrt(2 * math.log(max(rows * hidden, 2)))
        target = f["absmax"] / f["rms"] if f["rms"] > 0 else 0.0
        r0 = max(f["max_mean_over_std"], 0.0)
        zmax = 0.8 * target * math.sqrt(r0 * r0 + 1) - r0 if target > tails else None
        return make_layernorm(rng, t, rows=rows, hidden=hidden, family=fam, zmax=zmax if zmax and zmax > tails else None,
                              max_mean_over_std=max(f["max_mean_over_std"], 0.0), absmax=max(f["absmax"], 1e-30),
                              const_rows=0 if ca == 0 else rows if f["max_mean_over_std"] <= 0 else 1, const_absmax=ca,
                              weight_absmax=max(f["weight_absmax"], 0.0), bias_absmax=max(f["bias_absmax"], 0.0),
                              rms=f["rms"])
    if op == "geodesic":
        mn = max(f["min_sep_deg"], 1e-12)
        return make_geodesic(rng, t, n=_i(f["n"], lo=3, hi=MAX_POINTS), family="random", min_sep_deg=mn,
                             median_sep_deg=max(f["median_sep_deg"], mn), near_origin=mn < 1e-4)
    if op == "matmul":
        return make_matmul(rng, t, m=_i(f["m"], hi=CAP_ROWS), k=_i(f["k"]), n=_i(f["n"], hi=CAP_ROWS), family=fam,
                           out_bound=max(f["out_bound"], 1e-30), absmax=max(f["absmax"], 1e-30))
    raise ValueError(op)


def sample_inputs(op: str, dtype: str | torch.dtype, fitted: Fitted | OpFit, n_cases: int, seed: int) -> list[Case]:
    """n_cases synthetic calls of op in dtype (CPU tensors) whose sketches follow the fitted
    distributions. Deterministic for a seed. With several fits for op (variants, layers of other
    dtypes), each case picks one in proportion to its number of captured calls."""
    name, t = _check(op, dtype)
    operator(op)
    if isinstance(n_cases, bool) or not isinstance(n_cases, int) or n_cases < 0:
        raise ProfileError(f"{op}: n_cases must be an int >= 0, got {n_cases!r}")
    fits = [fitted] if isinstance(fitted, OpFit) else fitted.for_op(op, name)
    if not fits:
        raise ProfileError(f"{op}: the profile holds no {op} calls to sample from")
    weights = np.array([f.n for f in fits], dtype=np.float64)
    pick = np.random.default_rng([*seed_words(seed), 7]).choice(len(fits), size=n_cases, p=weights / weights.sum())
    draws: list[dict[str, float] | None] = [None] * n_cases
    for j, f in enumerate(fits):
        idx = np.flatnonzero(pick == j)
        if len(idx):
            for i, d in zip(idx, f.draw(np.random.default_rng([*seed_words(seed), 11, j]), len(idx))):
                draws[i] = d
    out = []
    for i in range(n_cases):
        f = fits[pick[i]]
        c = _build(op, t, draws[i], case_rng(seed, op, i, 3), "profile")  # type: ignore[arg-type]
        c.family = f"profile-sample:{f.variant}/{f.dtype}"
        out.append(c)
    return out
