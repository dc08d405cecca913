"""The sketch: a small, fixed set of numbers per operator call that drives its faults.

    python -c "import torch; from optwin.ingest import sketch; print(sketch('softmax', {'x': torch.randn(4, 8)}))"

Contract: /work/notes/sketch_contract.md. One function computes it at build time (over synthetic cases)
and online (inside inference processes, on CUDA tensors), so the matcher compares like with like.

How it is computed
------------------
Reference path (every device; the only path on CUDA): every input is read once, converted to
float64 (so squares of float32 values near 3e38 do not overflow and row statistics do not lose
digits), masked to its finite elements and reduced a handful of times. All reductions stay on the
inputs' device; the results are stacked into one float64 tensor (`sketch_tensor`, no host sync) and
`sketch` reads it with one `.tolist()`. Shapes come from tensor metadata (host side).

CPU fast path (rmsnorm, matmul, attention, layernorm): a host sync is free on CPU, so the common
case (all elements finite, 1e-18 < max|x| < 1e18, a row's sum of squares width * max|x|^2 well inside
float32's range, layernorm |mean|/std <= 100) takes one aminmax and one row-norm pass per input in float32, without the float64 copy and the masks; anything else falls
back to the reference path. The two agree to float32 rounding (tests/test_ingest_sketch.py). A
`WeightCache` passed by the capture memoizes statistics of tensors seen again unchanged (weights;
one activation fed to query/key/value), keyed by identity and `_version` (inference tensors,
which have no version counter, are never memoized).

Magnitude features are taken over FINITE elements only; an all-masked input gives 0 (empty inputs
are refused by optwin.validation).

Features every op has
---------------------
- ``numel``: elements of the main input (x; q for attention; a for matmul; lat1 for geodesic).
  Scales every accumulated rounding error.
- ``rows``: product of the main input's leading dims (for geodesic, n: every pair is a row).
  More rows, more chances for one bad row.
- ``absmax``: largest finite |value| of the main input (attention: over q and k; geodesic: over
  |lat1|, |lat2|). Overflow of squares/exp/products in low precision starts here.
- ``rms``: root mean square of the finite elements of the main input (attention: q and k together;
  geodesic: lat1 and lat2 together). With absmax it tells outlier channels (absmax >> rms) apart
  from uniformly large inputs.
- ``nonfinite``: count of NaN/±Inf over all inputs (softmax: -inf is a mask and is not counted).
  Any non-finite input propagates to a `nonfinite` output fault.

Per operator
------------
rmsnorm (x [..., hidden], weight [hidden])
  ``hidden``: width of the mean of squares (fp16 accumulation error grows with it);
  ``max_row_rms``: max over rows of sqrt(mean(x^2)): in native-dtype variants x*x overflows fp16 once
  |x| > 256, and mean(x*x) + eps underflows to eps for tiny rows, so this and absmax locate the faults;
  ``weight_absmax``: the final weight product can overflow even when the normalized row is fine.
softmax (x [..., n], -inf marks masked positions)
  ``n``: row length (sum of exps, entropy); ``max``/``min``: largest/smallest finite value, signed:
  the naive variant computes exp(x) without subtracting the max, so exp overflows in fp16 for
  x > 11.09 (bf16/fp32: > 88.7); ``max_row_range``: max over rows of rowmax - rowmin (finite entries;
  0 for fully masked rows): a wide range means peaked rows (low entropy) and exp underflow to 0;
  ``masked_rows``: rows that are entirely -inf, whose softmax is 0/0 = NaN; ``masked_frac``: fraction
  of -inf entries; ``peaked_frac``: among rows with a finite softmax (finite or -inf entries, at
  least one finite), the fraction whose probability row has Shannon entropy below
  DEFAULT_TOLERANCES.low_entropy_nats (0.3): low_entropy is "more than half the rows peaked", a
  statement about rows that no max over rows can see. Computed from the row max m, s = sum e and
  t = sum e*(x - m) with e = exp(x - m): H = log s - t/s, the same quantities a softmax kernel
  already holds (our Triton softmax emits it fused); ``min_row_max``: the smallest row maximum over
  rows with a finite entry (signed): a row whose every entry is below ln(smallest subnormal) has all
  its exps underflow in the naive variant, sum 0, and 0/0 = NaN (float16: below -17.3).
rope (x [seq, heads, d], positions [seq]; param base)
  ``seq``, ``heads``, ``d``; ``max_pos``: max |position|: angles pos * inv_freq lose absolute
  precision as positions grow (fp32 at 2^24, fp16/bf16 much earlier: low-precision-angles);
  ``base``: sets the frequencies.
attention (q, k, v [batch, heads, seq, d]; param causal)
  ``batch``, ``heads``, ``seq_q``, ``seq_k``, ``d``, ``causal`` (0/1);
  ``score_bound``: max_i ||q_i||_2 * max_j ||k_j||_2 / sqrt(d), max over all batches and heads, a
  bound on |scaled score| (fp16 scores overflow at 65504 in the math variant; large scores also make
  rows peaked: low entropy); ``v_absmax``: the output is a convex combination of v rows;
  ``peaked_frac``: as for softmax, over the attention probability rows (scaled scores, causal
  mask applied) whose scores are finite. Exact when batch*heads*seq_q*seq_k <= 2^22; above that
  every s-th query row of each head is used (s chosen to fit that budget, at least one row per
  head), so the sketch costs a small fraction of the attention itself (the Triton kernel's fused
  sketch, optwin.kernels.attention, sums every row's entropy below 2^17 query rows and a sample of
  whole query blocks of at least 2^16 rows above); ``max_score``: the largest
  unscaled score q_i.k_j over the visible keys (signed; same rows as peaked_frac, so a lower bound when
  rows are sampled, exact otherwise): the math variant forms q@k^T in the input dtype and overflows
  float16 past 65504 (score_bound only bounds it, by up to a factor of sqrt(d) and more).
layernorm (x [..., hidden], weight [hidden], bias [hidden])
  ``hidden``; ``max_mean_over_std``: max over the NON-constant rows (see const_absmax) of |mean|/std
  (population std, exact two-pass in float64; 1e30 should a non-constant row's std round to 0), 0
  when every row is constant: the one-pass variance E[x^2] - E[x]^2 cancels catastrophically once
  this ratio passes ~1/sqrt(u_fp32) ≈ 4e3; ``min_row_std``: the smallest row std over all rows (0
  with a constant row; eps dominates below sqrt(eps)); ``weight_absmax``, ``bias_absmax``: the
  affine step can overflow the output dtype; ``const_absmax`` (issue #8): the largest |c| over the
  exactly constant rows (rows with a finite entry whose finite entries are all equal: row min ==
  row max; 0 when there is none). A constant row's ratio is infinite, but for float16/bfloat16
  input its fp32 mean is exact (n c fits in fp32), h - m = 0 and y = bias: in the twins it cannot
  lose precision and turns NaN only once c^2 overflows fp32 (one-pass, |c| > 1.8e19); for float32
  input a sum of n copies of c can round (n not a power of two), and then (h - m) * rsqrt(tiny var
  + eps) loses precision or the one-pass variance goes below -eps (NaN). On the H200, triton and
  torch at hidden 384 also miss the exact mean by an ulp (rel_error ~ 1e-4 |c|), so there too the
  fault grows with |c|. Mixing these rows into the ratio put "constant row, small |c|" (never
  faults in one-pass fp16) in the cell of the worst cancelling rows (issue #8: 78 false warnings).
  A kernel computes it per row from the row's min and max (two exact reductions, no fp32 mean):
  constant when min == max, and then |c| = max(|min|, |max|).
geodesic (lat1, lon1, lat2, lon2 [n], degrees)
  ``n``; ``min_sep_deg``, ``median_sep_deg`` (lower median), ``max_sep_deg``: angular separation
  of each pair in degrees, float64 haversine, over pairs whose four inputs are finite. The acos
  variant loses all digits for nearby points (cos c ≈ 1), haversine near antipodes.
  ``rms_sep_deg``: root mean square of those separations. precision_loss is norm-wise,
  ||y - r|| / ||r||, and ||r|| = R * sqrt(n) * rms_sep: the few kilometres a near-identical pair
  is off by matter against it, not against the typical (median) pair.
matmul (a [m, k], b [k, n])
  ``m``, ``k``, ``n``; ``out_bound``: max row 2-norm of a * max column 2-norm of b, a bound on
  |a @ b| (Cauchy-Schwarz): output overflow in fp16/bf16; ``b_absmax``; k scales accumulation error.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from numbers import Real
import weakref
from typing import Any, Callable

import torch

from optwin.catalog import DEFAULT_TOLERANCES, operator, resolve_params
from optwin.errors import SketchError
from optwin.validation import check_kinds, check_names, check_shapes

COMMON_FEATURES: tuple[str, ...] = ("numel", "rows", "absmax", "rms", "nonfinite")

SKETCH_FEATURES: dict[str, tuple[str, ...]] = {
    "rmsnorm": COMMON_FEATURES + ("hidden", "max_row_rms", "weight_absmax"),
    "softmax": COMMON_FEATURES + ("n", "max", "min", "max_row_range", "masked_rows", "masked_frac", "peaked_frac",
                                  "min_row_max"),
    "rope": COMMON_FEATURES + ("seq", "heads", "d", "max_pos", "base"),
    "attention": COMMON_FEATURES + ("batch", "heads", "seq_q", "seq_k", "d", "causal", "score_bound", "v_absmax", "peaked_frac",
                  "max_score"),
    "layernorm": COMMON_FEATURES + ("hidden", "max_mean_over_std", "min_row_std", "weight_absmax", "bias_absmax",
                                    "const_absmax"),
    "geodesic": COMMON_FEATURES + ("n", "min_sep_deg", "median_sep_deg", "max_sep_deg", "rms_sep_deg"),
    "matmul": COMMON_FEATURES + ("m", "k", "n", "out_bound", "b_absmax"),
}

# Features that may be negative; every other feature is a count, a shape or a magnitude (>= 0).
SIGNED_FEATURES: frozenset[str] = frozenset({"max", "min", "max_score", "min_row_max"})

# Stand-in for +inf in max_mean_over_std (var == 0, mean != 0): the sketch is never inf or NaN.
RATIO_CAP = 1e30
# Largest |value| a received sketch keeps; larger finite values are clamped to it. Far beyond every replayed
# region (float32 tops out at 3.4e38), and small enough that the log binning over the tiny magnitude scale
# (regions._TINY = 1e-45) stays finite: 1e300 / 1e-45 would overflow to inf and its bin to an OverflowError.
FEATURE_CAP = 1e200
# Features that are fractions of rows or elements: within [0, 1].
FRACTION_FEATURES: frozenset[str] = frozenset({"masked_frac", "peaked_frac"})


def cap_features(sk: dict[str, float]) -> dict[str, float]:
    """sk with every value past ±FEATURE_CAP (±inf included) set to ±FEATURE_CAP, in place; returned.

    For sketches of tensors, which the log binning takes next: a magnitude can pass FEATURE_CAP or reach inf
    (a float64 input behind a float16 call; a bound multiplies norms), and floor(log2(inf)) would raise a bare
    OverflowError. An inf lies past every replayed region, where the conservative rule answers. NaN is left as
    it is: it has no region, and what to do with it is the caller's (call_sketch refuses it)."""
    for n, v in sk.items():
        if not -FEATURE_CAP <= v <= FEATURE_CAP and v == v:
            sk[n] = math.copysign(FEATURE_CAP, v)
    return sk

_F64 = torch.float64


# ----------------------------------------------------------------------------- reductions


def _finite(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 copy with non-finite entries set to 0, finite mask)."""
    h = x.to(_F64)
    fin = torch.isfinite(h)
    return torch.where(fin, h, 0.0), fin


def _amax(t: torch.Tensor) -> torch.Tensor:
    """max |t| of a finite-zeroed float64 tensor; 0 when empty."""
    if t.numel() == 0:
        return t.new_zeros(())
    return t.abs().amax()


def _count_nonfinite(fin: torch.Tensor) -> torch.Tensor:
    return (fin.numel() - fin.sum()).to(_F64)


def _rms(hf: torch.Tensor, fin: torch.Tensor) -> torch.Tensor:
    """RMS over finite entries (hf has them zeroed)."""
    return torch.sqrt(hf.square().sum() / fin.sum().clamp(min=1).to(_F64))


def _row_view(t: torch.Tensor) -> torch.Tensor:
    """[..., n] -> [rows, n]."""
    return t.reshape(-1, t.shape[-1]) if t.ndim else t.reshape(1, 1)


# Largest float64 temporary (bytes) a chunked reduction forms: softmax and rope reduce their input in
# chunks of rows, each converted to float64 and masked on its own, so a (4096, 4096) float32 softmax
# holds a few 32 MiB temporaries at a time, not eight 128 MiB copies of the whole input (872 MiB more
# peak memory for a 64 MiB input, on the GPU when the input is there). Matches attention's 2^22 budget.
CHUNK_BYTES = 32 << 20


def _row_chunks(r: torch.Tensor) -> Iterator[torch.Tensor]:
    """Slices of the rows of r (rows, n) whose float64 copies are at most CHUNK_BYTES (one row at least);
    the chunk count comes from the shape, so no host sync."""
    step = max(1, CHUNK_BYTES // (8 * max(1, r.shape[-1])))
    for i in range(0, r.shape[0], step):
        yield r[i:i + step]


# ----------------------------------------------------------------------------- per op


def _rmsnorm(t: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, Any]:
    x, w = t["x"], t["weight"]
    hidden = x.shape[-1]
    xf, xfin = _finite(x)
    wf, wfin = _finite(w)
    rows2 = _row_view(xf)  # (rows, hidden)
    if rows2.numel():
        row_ms = rows2.square().sum(-1) / _row_view(xfin).sum(-1).clamp(min=1).to(_F64)  # (rows,)
        max_row_rms = torch.sqrt(row_ms.amax())
    else:
        max_row_rms = xf.new_zeros(())
    return {
        "absmax": _amax(xf), "rms": _rms(xf, xfin), "nonfinite": _count_nonfinite(xfin) + _count_nonfinite(wfin),
        "hidden": float(hidden), "max_row_rms": max_row_rms, "weight_absmax": _amax(wf),
    }


def _softmax(t: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, Any]:
    x = t["x"]
    n = x.shape[-1]
    r = _row_view(x)  # (rows, n), input dtype
    numel = r.numel()
    if numel == 0:
        zero = torch.zeros((), dtype=_F64, device=x.device)
        return {"absmax": zero, "rms": zero, "nonfinite": zero, "n": float(n), "max": zero, "min": zero,
                "max_row_range": zero, "masked_rows": zero, "masked_frac": zero, "peaked_frac": zero,
                "min_row_max": zero}
    # Chunks of rows (see _row_chunks): max/min/counts combine exactly across chunks, and the sum of
    # squares is kept per row and summed once, so the result does not depend on the chunking.
    row_sq, acc = [], {}
    for c in _row_chunks(r):
        h = c.to(_F64)  # (cr, n)
        fin = torch.isfinite(h)
        hf = torch.where(fin, h, 0.0)
        row_sq.append(hf.square().sum(-1))  # (cr,)
        row_max = torch.where(fin, h, -math.inf).amax(-1)  # (cr,), -inf for rows without a finite entry
        row_min = torch.where(fin, h, math.inf).amin(-1)  # (cr,), +inf likewise
        row_any = fin.any(-1)  # (cr,)
        n_neg = (h == -math.inf).sum(-1)  # (cr,)
        entropy, eligible = logit_row_entropy(h)
        part = {
            "absmax": hf.abs().amax(), "max": row_max.amax(), "min": row_min.amin(),
            "max_row_range": torch.where(row_any, row_max - row_min, 0.0).amax(),
            "min_row_max": torch.where(row_any, row_max, math.inf).amin(),
            "fin": fin.sum(), "neg_inf": n_neg.sum(), "masked_rows": (n_neg == n).sum(),
            "peaked": (eligible & (entropy < DEFAULT_TOLERANCES.low_entropy_nats)).sum(), "eligible": eligible.sum(),
        }
        acc = part if not acc else {k: _COMBINE.get(k, torch.add)(acc[k], v) for k, v in part.items()}
    any_fin = acc["fin"] > 0
    return {
        "absmax": acc["absmax"], "rms": torch.sqrt(torch.cat(row_sq).sum() / acc["fin"].clamp(min=1).to(_F64)),
        "nonfinite": (numel - acc["fin"] - acc["neg_inf"]).to(_F64), "n": float(n),
        "max": torch.where(any_fin, acc["max"], 0.0), "min": torch.where(any_fin, acc["min"], 0.0),
        "max_row_range": acc["max_row_range"], "min_row_max": torch.where(any_fin, acc["min_row_max"], 0.0),
        "masked_rows": acc["masked_rows"].to(_F64), "masked_frac": acc["neg_inf"].to(_F64) / numel,
        # the fraction of peaked rows among the rows with a finite softmax; 0 when there are none
        "peaked_frac": acc["peaked"].to(_F64) / acc["eligible"].clamp(min=1).to(_F64),
    }


# How chunk partials combine (anything else: counts, added).
_COMBINE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "absmax": torch.maximum, "max": torch.maximum, "max_row_range": torch.maximum,
    "min": torch.minimum, "min_row_max": torch.minimum,
}


def logit_row_entropy(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax entropy in nats, eligible) per row of h (rows, n), float64 logits with -inf as a mask.
    Eligible rows have a finite softmax (finite or -inf entries, at least one finite); the entropy of
    the others is meaningless. H = log s - t / s with e = exp(x - m), s = sum e, t = sum e (x - m)."""
    fin = torch.isfinite(h)
    eligible = fin.any(-1) & (fin | (h == -math.inf)).all(-1)  # (rows,)
    m = torch.where(fin, h, -math.inf).amax(-1, keepdim=True)  # (rows, 1)
    z = torch.where(fin, h - torch.where(eligible[:, None], m, 0.0), -math.inf)  # (rows, n), <= 0
    e = torch.exp(z)  # (rows, n), 0 at masked entries
    s = e.sum(-1)  # (rows,) >= 1 on eligible rows
    t = torch.where(fin, e * torch.where(fin, z, 0.0), 0.0).sum(-1)  # (rows,)
    return torch.log(s.clamp(min=1.0)) - t / s.clamp(min=1.0), eligible


def _peaked_frac(h: torch.Tensor) -> torch.Tensor:
    """Fraction of rows of h (rows, n), float64 logits with -inf as a mask, whose softmax has
    entropy < low_entropy_nats, over the rows with a finite softmax; 0 when there are none."""
    entropy, eligible = logit_row_entropy(h)
    peaked = eligible & (entropy < DEFAULT_TOLERANCES.low_entropy_nats)
    return peaked.sum().to(_F64) / eligible.sum().clamp(min=1).to(_F64)


def _rope(t: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, Any]:
    x, pos = t["x"], t["positions"]
    seq, heads, d = x.shape
    # Chunks of (position, head) rows (see _row_chunks); sum of squares per row, summed once.
    absmax = torch.zeros((), dtype=_F64, device=x.device)
    fin_cnt = torch.zeros((), dtype=torch.int64, device=x.device)
    row_sq = [absmax.new_zeros(0)]  # (seq * heads,) once the chunks are in
    for c in _row_chunks(_row_view(x)):
        cf, cfin = _finite(c)  # (cr, d)
        row_sq.append(cf.square().sum(-1))
        absmax = torch.maximum(absmax, _amax(cf))
        fin_cnt = fin_cnt + cfin.sum()
    pf, pfin = _finite(pos)
    return {
        "absmax": absmax, "rms": torch.sqrt(torch.cat(row_sq).sum() / fin_cnt.clamp(min=1).to(_F64)),
        "nonfinite": (x.numel() - fin_cnt).to(_F64) + _count_nonfinite(pfin),
        "seq": float(seq), "heads": float(heads), "d": float(d), "max_pos": _amax(pf), "base": float(params["base"]),
    }


def _max_vec_norm(hf: torch.Tensor) -> torch.Tensor:
    """max over vectors along the last dim of their 2-norm; 0 when empty."""
    if hf.numel() == 0:
        return hf.new_zeros(())
    return torch.linalg.vector_norm(hf, dim=-1).amax()


# Score elements the attention sketch may form for peaked_frac (float64): beyond it, query rows are
# sampled at a stride. 2^22 keeps the sketch at a few percent of even a small attention call.
ATTENTION_SCORE_BUDGET = 1 << 22


def _attention_scores(q: torch.Tensor, k: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(peaked_frac, max_score) over the float64 scores of (a strided sample of) the query rows."""
    batch, heads, seq_q, d = q.shape
    seq_k = k.shape[2]
    rows_fit = max(1, ATTENTION_SCORE_BUDGET // max(1, batch * heads * seq_k))
    stride = max(1, math.ceil(seq_q / rows_fit))
    idx = torch.arange(0, seq_q, stride, device=q.device)  # (r,) sampled query positions
    qs = q[:, :, ::stride].to(_F64)  # (batch, heads, r, d)
    scores = qs @ k.to(_F64).transpose(-1, -2) / math.sqrt(max(d, 1))  # (batch, heads, r, seq_k)
    if causal:  # sdpa's is_causal, top-left aligned: query i sees keys j <= i
        hidden = torch.arange(seq_k, device=q.device)[None, :] > idx[:, None]  # (r, seq_k)
        scores = scores.masked_fill(hidden, -math.inf)
    # max_score over the rows without NaN or +inf scores (a -inf from an input -inf is only a zero
    # weight): the rows whose score maximum is finite, which is what a flash kernel's running max holds
    ok_row = ~(torch.isnan(scores) | (scores == math.inf)).any(-1, keepdim=True)  # (batch, heads, r, 1)
    top = torch.where(ok_row & torch.isfinite(scores), scores, -math.inf).amax()
    max_score = torch.where(top > -math.inf, top, 0.0) * math.sqrt(max(d, 1))  # unscaled q.k
    return _peaked_frac(scores.reshape(-1, seq_k)), max_score


def _attention(t: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, Any]:
    q, k, v = t["q"], t["k"], t["v"]
    batch, heads, seq_q, d = q.shape
    seq_k = k.shape[2]
    qf, qfin = _finite(q)
    kf, kfin = _finite(k)
    vf, vfin = _finite(v)
    # q and k together for absmax/rms: both feed the scores.
    sq = qf.square().sum() + kf.square().sum()
    cnt = (qfin.sum() + kfin.sum()).clamp(min=1).to(_F64)
    score_bound = _max_vec_norm(qf) * _max_vec_norm(kf) / math.sqrt(max(d, 1))
    return {
        "absmax": torch.maximum(_amax(qf), _amax(kf)), "rms": torch.sqrt(sq / cnt),
        "nonfinite": _count_nonfinite(qfin) + _count_nonfinite(kfin) + _count_nonfinite(vfin),
        "batch": float(batch), "heads": float(heads), "seq_q": float(seq_q), "seq_k": float(seq_k), "d": float(d),
        "causal": float(bool(params["causal"])), "score_bound": score_bound, "v_absmax": _amax(vf),
        **dict(zip(("peaked_frac", "max_score"), _attention_scores(q, k, bool(params["causal"])))),
    }


def _layernorm(t: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, Any]:
    x = t["x"]
    hidden = x.shape[-1]
    xf, xfin = _finite(x)
    wf, wfin = _finite(t["weight"])
    bf, bfin = _finite(t["bias"])
    out: dict[str, Any] = {
        "absmax": _amax(xf), "rms": _rms(xf, xfin),
        "nonfinite": _count_nonfinite(xfin) + _count_nonfinite(wfin) + _count_nonfinite(bfin),
        "hidden": float(hidden), "weight_absmax": _amax(wf), "bias_absmax": _amax(bf),
    }
    r, rfin = _row_view(xf), _row_view(xfin)  # (rows, hidden)
    if r.numel() == 0:
        out["max_mean_over_std"] = out["min_row_std"] = out["const_absmax"] = xf.new_zeros(())
        return out
    cnt = rfin.sum(-1, keepdim=True).clamp(min=1).to(_F64)  # (rows, 1)
    mean = r.sum(-1, keepdim=True) / cnt  # (rows, 1)
    dev = torch.where(rfin, r - mean, 0.0)  # (rows, hidden): exact two-pass variance
    std = torch.sqrt(dev.square().sum(-1) / cnt.squeeze(-1))  # (rows,)
    am = mean.squeeze(-1).abs()  # (rows,)
    # Constant rows (finite entries all equal: row min == row max, exact in any precision) are told
    # apart from cancelling ones: their ratio is infinite but their fault is set by |c| alone.
    rmax = torch.where(rfin, r, -math.inf).amax(-1)  # (rows,)
    const = rfin.any(-1) & (torch.where(rfin, r, math.inf).amin(-1) == rmax)  # (rows,)
    ratio = torch.where(std > 0, am / std, torch.where(am > 0, RATIO_CAP, 0.0)).clamp(max=RATIO_CAP)
    out["max_mean_over_std"] = torch.where(const, 0.0, ratio).amax()
    out["min_row_std"] = std.amin()
    out["const_absmax"] = torch.where(const, rmax.abs(), 0.0).amax()
    return out


def _geodesic(t: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, Any]:
    n = t["lat1"].shape[0]
    (la1, f1), (lo1, f2), (la2, f3), (lo2, f4) = (_finite(t[k]) for k in ("lat1", "lon1", "lat2", "lon2"))
    valid = f1 & f2 & f3 & f4  # (n,)
    lat_abs = torch.maximum(_amax(la1), _amax(la2))
    cnt_lat = (f1.sum() + f3.sum()).clamp(min=1).to(_F64)
    rms = torch.sqrt((la1.square().sum() + la2.square().sum()) / cnt_lat)
    nonfinite = sum(_count_nonfinite(f) for f in (f1, f2, f3, f4))
    out: dict[str, Any] = {"absmax": lat_abs, "rms": rms, "nonfinite": nonfinite, "n": float(n)}
    if n == 0:
        out["min_sep_deg"] = out["median_sep_deg"] = out["max_sep_deg"] = out["rms_sep_deg"] = la1.new_zeros(())
        return out
    p1, p2 = torch.deg2rad(la1), torch.deg2rad(la2)
    dl = torch.deg2rad(lo2 - lo1)
    a = torch.sin((p2 - p1) / 2).square() + torch.cos(p1) * torch.cos(p2) * torch.sin(dl / 2).square()
    sep = torch.rad2deg(2 * torch.asin(torch.sqrt(a.clamp(0.0, 1.0))))  # (n,)
    nvalid = valid.sum()
    has = nvalid > 0
    srt = torch.where(valid, sep, math.inf).sort().values  # invalid pairs sort last
    mid = ((nvalid - 1).clamp(min=0) // 2).view(1)
    out["min_sep_deg"] = torch.where(has, srt[0], 0.0)
    out["median_sep_deg"] = torch.where(has, srt.gather(0, mid)[0], 0.0)
    out["max_sep_deg"] = torch.where(valid, sep, 0.0).amax()
    out["rms_sep_deg"] = torch.sqrt(torch.where(valid, sep, 0.0).square().sum() / nvalid.clamp(min=1).to(_F64))
    return out


def _matmul(t: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, Any]:
    a, b = t["a"], t["b"]
    m, k = a.shape
    n = b.shape[1]
    af, afin = _finite(a)
    bf, bfin = _finite(b)
    row_a = _max_vec_norm(af)  # max_i ||a[i, :]||
    col_b = _max_vec_norm(bf.T)  # max_j ||b[:, j]||
    b_abs = _amax(bf)
    return {
        "absmax": torch.maximum(_amax(af), b_abs), "rms": _rms(af, afin),
        "nonfinite": _count_nonfinite(afin) + _count_nonfinite(bfin),
        "m": float(m), "k": float(k), "n": float(n), "out_bound": row_a * col_b, "b_absmax": b_abs,
    }


_OPS = {
    "rmsnorm": _rmsnorm, "softmax": _softmax, "rope": _rope, "attention": _attention,
    "layernorm": _layernorm, "geodesic": _geodesic, "matmul": _matmul,
}

_MAIN = {"rmsnorm": "x", "softmax": "x", "rope": "x", "attention": "q", "layernorm": "x", "geodesic": "lat1", "matmul": "a"}


# ----------------------------------------------------------------------------- CPU fast path
#
# On CPU a host sync is free, so the common case (every element finite, magnitudes well inside
# float32's range) skips the float64 copy and the masking passes: one aminmax and one row-norm pass
# per input, in the input's precision (half types upcast to float32). Anything else (non-finite
# elements, |x| outside (1e-18, 1e18) where float32 squares under/overflow, rows whose sum of squares
# width * max|x|^2 could pass float32's range, layernorm rows with |mean|/std > 100 where float32
# variance loses digits) falls back to the exact float64 path above.
# The two paths agree to float32 rounding (tested); CUDA always takes the float64 path (no sync).

_FAST_LO, _FAST_HI = 1e-18, 1e18
# Largest row sum of squares (bounded by width * max|x|^2) a float32 norm pass may form: float32 tops
# out at 3.4e38, and a bound 30x below it leaves room for rounding. |x| = 5e17 at hidden 4096 (1e39)
# overflowed to inf here while the exact path gives 9e17 (per element, < 1e18 passed).
_FAST_SUMSQ = 1e37


def _fits_f32(a: float, width: int) -> bool:
    """True when `width` squares of magnitude <= a sum inside float32's range (see _FAST_SUMSQ)."""
    return a * a * max(width, 1) <= _FAST_SUMSQ


class WeightCache:
    """Memo of per-tensor statistics keyed by the tensor's identity (its view base), layout and
    `_version`: a capture reduces a static weight once, and an activation fed to several
    projections (BERT's x -> query, key, value) once per forward. Entries hold weak references
    only, so a freed tensor is never matched, and dead entries are pruned as the memo grows."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._d: dict[tuple, tuple[weakref.ref, int, Any]] = {}
        self.max_entries = max_entries

    def get(self, t: torch.Tensor, kind: str, fn: Callable[[], Any]) -> Any:
        base = t if t._base is None else t._base
        if base.is_inference():
            # Tensors made under torch.inference_mode have no version counter (`_version` raises), yet
            # they can still be written in place inside inference mode (a KV cache, `x.add_()`), so
            # identity and layout alone would serve stale statistics. No sound key: reduce every time.
            # Parameters made outside inference mode (the weights, the memo's point) keep their counter.
            return fn()
        key = (id(base), kind, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)
        hit = self._d.get(key)
        if hit is not None and hit[0]() is base and hit[1] == base._version:
            return hit[2]
        val = fn()
        if len(self._d) >= self.max_entries:
            self._d = {k: v for k, v in self._d.items() if v[0]() is not None}
            if len(self._d) >= self.max_entries:
                self._d.clear()
        self._d[key] = (weakref.ref(base), base._version, val)
        return val


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _dense(x: torch.Tensor) -> torch.Tensor:
    """A contiguous alias of x when one exists (x.T of a weight): whole-tensor reductions over a
    strided view are ~40x slower on CPU, and max |x| does not depend on the layout."""
    if x.is_contiguous() or x.ndim != 2:
        return x
    return x.T if x.T.is_contiguous() else x


def _fast_amax(x: torch.Tensor) -> float | None:
    """max |x| if every element is finite and within the fast range (or exactly 0), else None."""
    if x.numel() == 0:
        return None
    mn, mx = torch.aminmax(_f32(_dense(x)))
    # abs: for an all-zero x, -mn is -0.0 and max(-0.0, 0.0) keeps its first argument, so the
    # magnitude read -0.0 (layernorm's bias_absmax of a zero bias). max(-mn, mx) >= 0 otherwise.
    a = abs(max(-float(mn), float(mx)))
    if not math.isfinite(a) or (a != 0.0 and not _FAST_LO < a < _FAST_HI):
        return None
    return a


def _fast_rows(x: torch.Tensor) -> tuple[float, torch.Tensor] | None:
    """(absmax, float64 2-norms along the last dim) or None to fall back."""
    a = _fast_amax(x)
    if a is None or not _fits_f32(a, x.shape[-1]):
        return None
    return a, torch.linalg.vector_norm(_f32(x), dim=-1).to(_F64)


def _fast_rmsnorm(t: dict[str, torch.Tensor], params: dict[str, Any], cache: WeightCache | None) -> dict[str, Any] | None:
    x, w = t["x"], t["weight"]
    rx = _fast_rows(x)
    wa = _fast_amax(w)
    if rx is None or wa is None:
        return None
    a, rn = rx
    h = x.shape[-1]
    return {"absmax": a, "rms": math.sqrt(float(rn.square().sum()) / x.numel()), "nonfinite": 0.0,
            "hidden": float(h), "max_row_rms": float(rn.amax()) / math.sqrt(h), "weight_absmax": wa}


def _fast_matmul(t: dict[str, torch.Tensor], params: dict[str, Any], cache: WeightCache | None) -> dict[str, Any] | None:
    a, b = t["a"], t["b"]
    ra = cache.get(a, "matmul.a", lambda: _fast_rows(a)) if cache is not None else _fast_rows(a)

    def bstats() -> tuple[float, float] | None:
        ba = _fast_amax(b)
        if ba is None or not _fits_f32(ba, b.shape[0]):  # columns of b: k squares each
            return None
        bt = b.T  # column norms of b = row norms of b.T (contiguous for b = W.T: the fast layout)
        return ba, float(torch.linalg.vector_norm(_f32(bt), dim=-1).amax())

    bs = cache.get(b, "matmul.b", bstats) if cache is not None else bstats()
    if ra is None or bs is None:
        return None
    aa, rn = ra
    ba, cn = bs
    return {"absmax": max(aa, ba), "rms": math.sqrt(float(rn.square().sum()) / a.numel()), "nonfinite": 0.0,
            "m": float(a.shape[0]), "k": float(a.shape[1]), "n": float(b.shape[1]), "out_bound": float(rn.amax()) * cn,
            "b_absmax": ba}


def _fast_attention(t: dict[str, torch.Tensor], params: dict[str, Any], cache: WeightCache | None) -> dict[str, Any] | None:
    q, k, v = t["q"], t["k"], t["v"]
    rq, rk, va = _fast_rows(q), _fast_rows(k), _fast_amax(v)
    if rq is None or rk is None or va is None:
        return None
    batch, heads, seq_q, d = q.shape
    sq = float(rq[1].square().sum()) + float(rk[1].square().sum())
    return {"absmax": max(rq[0], rk[0]), "rms": math.sqrt(sq / (q.numel() + k.numel())), "nonfinite": 0.0,
            "batch": float(batch), "heads": float(heads), "seq_q": float(seq_q), "seq_k": float(k.shape[2]), "d": float(d),
            "causal": float(bool(params["causal"])),
            "score_bound": float(rq[1].amax()) * float(rk[1].amax()) / math.sqrt(max(d, 1)), "v_absmax": va,
            **{n: float(v) for n, v in zip(("peaked_frac", "max_score"), _attention_scores(q, k, bool(params["causal"])))}}


def _fast_layernorm(t: dict[str, torch.Tensor], params: dict[str, Any], cache: WeightCache | None) -> dict[str, Any] | None:
    x = t["x"]
    a, wa, ba = _fast_amax(x), _fast_amax(t["weight"]), _fast_amax(t["bias"])
    if a is None or wa is None or ba is None or not _fits_f32(2.0 * a, x.shape[-1]):  # |x - mean| <= 2 max|x|
        return None
    r = _row_view(_f32(x))  # (rows, hidden)
    mean = r.mean(-1, keepdim=True)  # (rows, 1); two-pass: centered norms, no cancellation
    std = torch.linalg.vector_norm(r - mean, dim=-1).to(_F64) / math.sqrt(r.shape[-1])  # (rows,)
    mean = mean.squeeze(-1).to(_F64)
    am = mean.abs()
    if not bool((std > 0).all()):
        return None
    ratio = float((am / std).amax())
    if not ratio <= 100.0:  # float32 variance loses digits as |mean|/std grows: exact path
        return None
    ms = float((std.square() + mean.square()).mean())  # mean of x^2 (rows have equal length)
    return {"absmax": a, "rms": math.sqrt(max(ms, 0.0)), "nonfinite": 0.0, "hidden": float(x.shape[-1]),
            "max_mean_over_std": ratio, "min_row_std": float(std.amin()), "weight_absmax": wa, "bias_absmax": ba,
            "const_absmax": 0.0}  # every std > 0 here: no constant row (those take the exact path)


_FAST: dict[str, Callable[..., dict[str, Any] | None]] = {
    "rmsnorm": _fast_rmsnorm, "matmul": _fast_matmul, "attention": _fast_attention, "layernorm": _fast_layernorm,
}


# ----------------------------------------------------------------------------- public


def sketch_tensor(op: str, inputs: Mapping[str, torch.Tensor], params: dict[str, Any] | None = None,
                  *, cache: WeightCache | None = None, exact: bool = False) -> tuple[tuple[str, ...], torch.Tensor]:
    """(feature names, float64 tensor of their values) on the inputs' device, without a host sync.

    Raises CatalogError for an unknown op or param, InputError for missing/extra inputs, non-tensors,
    wrong ndim, empty inputs, disagreeing shapes, or integer, bool or complex tensors where the op takes
    floats (and floats where it takes integers).

    cache: a WeightCache reused across calls (capture passes one) to memoize weight statistics.
    exact: skip the CPU fast path (tests compare the two).
    """
    spec = operator(op)
    # Shared checks (optwin.validation): names, tensor types, ndims, cross-input shapes, floats where the op takes
    # floats. The float width and the values are not errors for a sketch: non-finite values are what
    # `nonfinite` counts.
    check_names(spec, inputs)
    check_shapes(spec, inputs)
    check_kinds(spec, inputs)
    t = {name: inputs[name].detach() for name in spec.input_names()}  # never build autograd graphs
    p = resolve_params(op, params)
    main = t[_MAIN[op]]
    vals = None
    if not exact and main.device.type == "cpu" and op in _FAST:
        vals = _FAST[op](t, p, cache)
    if vals is None:
        vals = _OPS[op](t, p)
    vals["numel"] = float(main.numel())
    vals["rows"] = float(main.shape[0]) if op == "geodesic" else float(math.prod(main.shape[:-1]))
    names = SKETCH_FEATURES[op]
    device = main.device
    host = [i for i, nm in enumerate(names) if not isinstance(vals[nm], torch.Tensor)]
    dev = [i for i, nm in enumerate(names) if isinstance(vals[nm], torch.Tensor)]
    if not dev:  # CPU fast path: every value is already a host float
        return names, torch.tensor([float(vals[nm]) for nm in names], dtype=_F64)
    # Shape features arrive as host floats. A pageable host->device copy, or indexing a device tensor
    # with a Python list (its index tensor is copied too), would synchronise the stream: the shape
    # values come from a per-device cache filled once through pinned memory, and the features are
    # assembled by one stack of 0-d views.
    consts = _device_constants(tuple(float(vals[names[i]]) for i in host), device)
    at = {i: j for j, i in enumerate(host)}
    pieces = [consts[at[i]] if i in at else vals[nm].to(_F64).reshape(()) for i, nm in enumerate(names)]
    return names, torch.stack(pieces)


_CONSTANTS: dict[tuple[Any, tuple[float, ...]], torch.Tensor] = {}


def _device_constants(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """`values` as a float64 tensor on `device`, copied once from pinned memory (asynchronously)."""
    key = (device, values)
    t = _CONSTANTS.get(key)
    if t is None:
        if len(_CONSTANTS) > 4096:  # shapes of one model are few; bound the cache all the same
            _CONSTANTS.clear()
        host = torch.tensor(values, dtype=_F64)
        if device.type == "cuda":
            host = host.pin_memory()
        t = _CONSTANTS[key] = host.to(device, non_blocking=True)
    return t


def sketch(op: str, inputs: Mapping[str, torch.Tensor], params: dict[str, Any] | None = None) -> dict[str, float]:
    """The sketch of one call as {feature: float}; the features of `op` are SKETCH_FEATURES[op]."""
    names, values = sketch_tensor(op, inputs, params)
    return dict(zip(names, values.tolist()))


def validate_sketch(op: str, sketch: Any) -> dict[str, float]:
    """Check a sketch received from outside (matcher, sidecar, logs); return it as {feature: float}.

    Required: every feature of SKETCH_FEATURES[op]; each value a finite real number (bool, str,
    None, NaN and ±inf are rejected); every feature except softmax max/min non-negative; causal
    0 or 1; masked_frac and peaked_frac within [0, 1]; rope's base above 1. Magnitudes beyond
    FEATURE_CAP are clamped to it. Extra keys are ignored (and dropped), so newer producers can send
    more. Raises SketchError with one line naming the op and the first problem.
    """
    names = SKETCH_FEATURES[operator(op).name]
    if not isinstance(sketch, Mapping):
        raise SketchError(f"{op}: sketch must be a JSON object of feature -> number, got {type(sketch).__name__}")
    missing = [n for n in names if n not in sketch]
    if missing:
        raise SketchError(f"{op}: sketch is missing features {', '.join(missing)}")
    out: dict[str, float] = {}
    for n in names:
        v = sketch[n]
        if isinstance(v, bool) or not isinstance(v, Real) or type(v).__name__ == "bool_":
            raise SketchError(f"{op}: sketch feature {n} must be a number, got {type(v).__name__} {v!r:.40}")
        try:
            f = float(v)
        except OverflowError:  # an int past float64's range
            f = math.inf
        if not math.isfinite(f):
            raise SketchError(f"{op}: sketch feature {n} must be finite, got {v!r:.40}")
        if f < 0 and n not in SIGNED_FEATURES:
            raise SketchError(f"{op}: sketch feature {n} must be >= 0, got {f}")
        out[n] = max(-FEATURE_CAP, min(f, FEATURE_CAP))
    if "causal" in out and out["causal"] not in (0.0, 1.0):
        raise SketchError(f"{op}: sketch feature causal must be 0 or 1, got {out['causal']}")
    for n in FRACTION_FEATURES.intersection(out):
        if out[n] > 1.0:
            raise SketchError(f"{op}: sketch feature {n} must be within [0, 1], got {out[n]}")
    if op == "rope" and out["base"] <= 1.0:
        raise SketchError(f"{op}: sketch feature base must be > 1, got {out['base']}")
    return out
