"""The operator catalog and fault contract as data (spec: shared/spec/operators.md, v1).

    python -c "from optwin.catalog import CATALOG; print(list(CATALOG))"

Everything else (twins, sketches, builds, matcher, kernels, dashboard) reads this module instead of
repeating names, dtypes, defaults or tolerances. Nothing here imports torch, so the matcher's import
path stays light.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optwin.errors import CatalogError

FAULT_TYPES: tuple[str, ...] = ("nonfinite", "precision_loss", "low_entropy")
DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")

# Unit roundoff u = 2^-p of each output dtype (p = significand bits incl. the implicit one, minus 1
# for round-to-nearest). precision_loss fires above 16 u (spec, "Faults").
UNIT_ROUNDOFF: dict[str, float] = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}


@dataclass(frozen=True)
class Tolerances:
    """Fault thresholds. The defaults are the spec's; builds may override them (and record it)."""

    precision_loss_ulps: float = 16.0  # tau = ulps * u(output dtype)
    geodesic_rel: float = 1e-3  # tau for geodesic, kilometres relative
    low_entropy_nats: float = 0.3  # a row is "peaked" below this entropy
    low_entropy_row_fraction: float = 0.5  # fault when more than this fraction of rows is peaked

    def precision_tau(self, op: str, out_dtype: str) -> float:
        if op == "geodesic":
            return self.geodesic_rel
        return self.precision_loss_ulps * UNIT_ROUNDOFF[out_dtype]


DEFAULT_TOLERANCES = Tolerances()


def resolve_tolerances(tol: Tolerances | Mapping[str, Any] | None, op: str = "") -> Tolerances:
    """Tolerances from a Tolerances, a mapping of some of its fields (the others keep the spec's
    defaults, e.g. {"precision_loss_ulps": 8}) or None (the defaults); anything else, an unknown
    field or a value that is not a finite number >= 0 is a one-line CatalogError (naming `op`)."""
    where = f"{op}: " if op else ""
    if tol is None:
        return DEFAULT_TOLERANCES
    if isinstance(tol, Tolerances):
        return tol
    if not isinstance(tol, Mapping):
        raise CatalogError(f"{where}tolerances must be a Tolerances or a dict of its fields, got {type(tol).__name__}")
    fields = [f.name for f in dataclasses.fields(Tolerances)]
    unknown = [k for k in tol if k not in fields]
    if unknown:
        raise CatalogError(f"{where}unknown tolerances {sorted(unknown, key=repr)}; expected some of {fields}")
    values = {k: _finite_real(v) for k, v in tol.items()}
    for k, f in values.items():
        if f is None or f < 0:
            raise CatalogError(f"{where}tolerance {k!r:.40} must be a finite number >= 0, got {tol[k]!r:.40}")
    return Tolerances(**values)


@dataclass(frozen=True)
class InputSpec:
    """One named input. `dtype` is "op" when the tensor must be in the variant's dtype."""

    name: str
    shape: str  # human-readable, e.g. "[..., hidden]"
    min_ndim: int
    max_ndim: int | None
    dtype: str = "op"  # "op" | "float32" | "int64"
    allow_neg_inf: bool = False  # softmax masks with -inf; every other input must be finite


@dataclass(frozen=True)
class Variant:
    name: str
    numerics: str  # what the implementation does, rounding point by rounding point
    production: bool = True  # False for our own Triton kernels


@dataclass(frozen=True)
class Operator:
    name: str
    inputs: tuple[InputSpec, ...]
    variants: tuple[Variant, ...]
    dtypes: tuple[str, ...]
    fault_types: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)  # name -> default
    constants: dict[str, float] = field(default_factory=dict)  # eps, radius, ...
    output_dtype: str = "op"  # "op": same as the variant dtype
    # Sketch features that drive this op's faults, in the order the fingerprint regions bin them. Few
    # on purpose (one or two magnitudes, softmax three): every extra axis thins the cases per cell.
    # Chosen by per-feature AUROC against CPU-labelled held-out cases, among the features the
    # ingest generators can target (profile-sample builds must land in the cells they mean to):
    # shapes (hidden, n, d, k) separated faults worse than the magnitudes they were paired with.
    region_features: tuple[str, ...] = ()
    # Fault types driven by a subset of the region features: (fault type, its features). The
    # matcher judges such a fault on the fingerprints pooled over the other features, so a sketch
    # whose full cell was never replayed is still answered by the cells that share its relevant
    # bins (low_entropy depends on peaked_frac alone; without this, a held-out softmax sketch in an
    # empty 4-D cell borrowed its low_entropy from neighbours chosen by max and max_row_range).
    fault_features: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def features_for(self, fault_type: str) -> tuple[str, ...]:
        """The region features that decide `fault_type` (all of them unless fault_features says)."""
        return dict(self.fault_features).get(fault_type, self.region_features)

    @property
    def variant_names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.variants)

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise CatalogError(
            f"{self.name}: unknown variant {name!r}; expected one of {', '.join(self.variant_names)}"
        )

    def out_dtype(self, dtype: str) -> str:
        return dtype if self.output_dtype == "op" else self.output_dtype

    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)


_FLOATS = DTYPES
_WITH_ENTROPY = ("nonfinite", "precision_loss", "low_entropy")
_PLAIN = ("nonfinite", "precision_loss")

CATALOG: dict[str, Operator] = {
    "rmsnorm": Operator(
        name="rmsnorm",
        inputs=(InputSpec("x", "[..., hidden]", 1, None), InputSpec("weight", "[hidden]", 1, 1)),
        variants=(
            Variant("fp32-acc", "h = x.float(); v = mean(h*h) fp32; y = weight * (h*rsqrt(v+eps)).to(dtype), product in dtype"),
            Variant("native-dtype", "v = mean(x*x) with x*x rounded to dtype, mean fp32-accumulated then rounded to dtype; "
                    "v+eps, rsqrt, x*r and weight*(.) each rounded to dtype"),
            Variant("triton", "fp32 compute: v = tree-sum(fma-folded h*h, 4 neighbours per fold)/n; r = rsqrt(v+eps); "
                    "y = (h*r*w.float()).to(dtype); rows > 65536: per-lane sums of rounded h*h over 4096-wide chunks",
                    production=False),
        ),
        dtypes=_FLOATS,
        fault_types=_PLAIN,
        constants={"eps": 1e-6},
        region_features=("absmax", "max_row_rms"),
    ),
    "softmax": Operator(
        name="softmax",
        inputs=(InputSpec("x", "[..., n]", 1, None, allow_neg_inf=True),),
        variants=(
            Variant("torch", "fp32 internally: m = max; e = exp(x-m); y = e/sum(e), rounded to dtype once"),
            Variant("naive", "e = exp(x) rounded to dtype; s = sum(e) fp32-accumulated, rounded to dtype; y = e/s rounded to dtype"),
            Variant("triton", "fp32: m = max; e = exp(x-m) (approximate exp); s = tree-sum(e); y = (e/s).to(dtype); "
                    "rows > 65536: per 4096-wide piece m_k and s_k = tree-sum(exp(x-m_k)), then "
                    "s = sum_k s_k*exp(m_k-m) in float64, rounded to fp32 once", production=False),
        ),
        dtypes=_FLOATS,
        fault_types=_WITH_ENTROPY,
        region_features=("max", "min_row_max", "masked_rows", "peaked_frac"),
        fault_features=(("nonfinite", ("max", "min_row_max", "masked_rows")),
                        ("precision_loss", ("max", "min_row_max", "masked_rows")),
                        ("low_entropy", ("peaked_frac",))),
    ),
    "rope": Operator(
        name="rope",
        inputs=(InputSpec("x", "[seq, heads, d]", 3, 3), InputSpec("positions", "[seq]", 1, 1, dtype="int64")),
        variants=(
            Variant("fp32-angles", "inv fp32; ang = pos.float()*inv fp32; cos/sin fp32 then rounded to dtype; "
                    "x*cos, rotate_half(x)*sin and their sum each rounded to dtype"),
            Variant("low-precision-angles", "pos and inv rounded to dtype; ang, cos, sin in dtype; combine in dtype"),
            Variant("triton", "fp32: ang = pos.float()*inv; y = (x*cos + rotate_half(x)*sin) in fp32, rounded to dtype once", production=False),
        ),
        dtypes=_FLOATS,
        fault_types=_PLAIN,
        params={"base": 10000.0},
        region_features=("max_pos",),
    ),
    "attention": Operator(
        name="attention",
        inputs=(
            InputSpec("q", "[batch, heads, seq_q, d]", 4, 4),
            InputSpec("k", "[batch, heads, seq_k, d]", 4, 4),
            InputSpec("v", "[batch, heads, seq_k, d]", 4, 4),
        ),
        variants=(
            Variant("sdpa", "flash/efficient kernel: fp32 scores and online softmax, output rounded to dtype"),
            Variant("math", "s = q@k^T in dtype (fp32 acc); s*scale in dtype; causal -inf; softmax in dtype (torch); y = p@v in dtype"),
            Variant("triton", "flash: x = fp32 dot(q,k^T)*fp32(log2e/sqrt(d)); online softmax per BLOCK_N keys with exp2, "
                    "l = l*a + tree-sum(p); acc = acc*a + dot(p.to(dtype), v) fp32; y = (acc/l).to(dtype)", production=False),
        ),
        dtypes=_FLOATS,
        fault_types=_WITH_ENTROPY,
        params={"causal": False},
        region_features=("score_bound", "seq_k", "peaked_frac", "max_score"),
        fault_features=(("nonfinite", ("max_score",)), ("precision_loss", ("score_bound", "seq_k")),
                        ("low_entropy", ("peaked_frac",))),
    ),
    "layernorm": Operator(
        name="layernorm",
        inputs=(
            InputSpec("x", "[..., hidden]", 1, None),
            InputSpec("weight", "[hidden]", 1, 1),
            InputSpec("bias", "[hidden]", 1, 1),
        ),
        variants=(
            Variant("torch", "aten CUDA, fp32 Welford mean/var; hidden % 4 == 0: the vectorized kernel (128 threads, "
                    "runs of 4 elements, fma updates, shuffle-down then shared-memory merges with coef = 1/count), "
                    "y = fma(w, r*(h-m), b); else RowwiseMoments (512 threads, Welford: mean + delta/n, fma m2 updates, "
                    "warp then block merges with nb/n), y = fma((h-m)*r, w, b); r = rsqrt(var+eps); rounded to dtype"),
            Variant("one-pass", "h = x.float(); m = mean(h); var = mean(h*h) - m*m; y = (h-m)*rsqrt(var+eps)*w+b fp32, rounded to dtype"),
            Variant("triton", "fp32 two-pass: m = tree-sum(h)/n; var = tree-sum(fma-folded (h-m)^2, 4 neighbours per fold)/n; "
                    "y = fma((h-m)*rsqrt(var+eps), w, b).to(dtype); rows > 65536: per-lane sums over 4096-wide "
                    "chunks, rounded products, y = ((h-m)*r*w + b); rows of 4096..65536 that a chunk of 4096, 2048 or "
                    "1024 divides into at least 3 pieces: Welford per lane over the largest such chunk's pieces (fma "
                    "updates, 1/count rounded once), a tree of Chan merges, y as above",
                    production=False),
        ),
        dtypes=_FLOATS,
        fault_types=_PLAIN,
        constants={"eps": 1e-5},
        # max_mean_over_std is over the non-constant rows; exactly constant rows go to const_absmax
        # (their fault, if any, is set by |c|: c^2 overflow, fp32 means that round; issue #8).
        # const_odd_width (derived from hidden and const_absmax, optwin.fingerprints.regions.DERIVED): a
        # constant row's mean can round only where the width is not a power of two.
        region_features=("max_mean_over_std", "absmax", "const_absmax", "const_odd_width"),
    ),
    "geodesic": Operator(
        name="geodesic",
        inputs=tuple(InputSpec(n, "[n] degrees", 1, 1) for n in ("lat1", "lon1", "lat2", "lon2")),
        variants=(
            Variant("acos", "c = sin p1 sin p2 + cos p1 cos p2 cos(l2-l1); y = R acos(c), all float32"),
            Variant("haversine", "a = sin^2(dp/2) + cos p1 cos p2 sin^2(dl/2); y = 2R asin(sqrt(a)), all float32"),
        ),
        dtypes=("float32",),
        fault_types=_PLAIN,
        constants={"radius_km": 6371.0088},
        # precision_loss is norm-wise: against ||r||, whose scale rms_sep_deg gives; acos's NaN (c
        # rounded past 1) needs only one near-identical pair, so nonfinite is judged on min_sep_deg.
        region_features=("min_sep_deg", "median_sep_deg", "rms_sep_deg"),
        fault_features=(("nonfinite", ("min_sep_deg",)),),
    ),
    "matmul": Operator(
        name="matmul",
        inputs=(InputSpec("a", "[m, k]", 2, 2), InputSpec("b", "[k, n]", 2, 2)),
        variants=(Variant("torch", "cuBLAS: products exact, fp32 accumulation (blocked/split-K), output rounded to dtype"),),
        dtypes=_FLOATS,
        fault_types=_PLAIN,
        region_features=("out_bound", "absmax"),
    ),
}


def operator(op: str) -> Operator:
    """The catalog entry of `op`, or a one-line error naming the known operators."""
    try:
        return CATALOG[op]
    except (KeyError, TypeError):
        raise CatalogError(f"unknown operator {op!r}; expected one of {', '.join(CATALOG)}") from None


def check_variant_dtype(op: str, variant: str, dtype: str) -> Operator:
    """Validate the (op, variant, dtype) triple and return the operator."""
    spec = operator(op)
    spec.variant(variant)
    if dtype not in spec.dtypes:
        raise CatalogError(f"{op}/{variant}: unsupported dtype {dtype!r}; expected one of {', '.join(spec.dtypes)}")
    return spec


def all_triples(include_triton: bool = True) -> list[tuple[str, str, str]]:
    """Every (op, variant, dtype) the catalog defines, in catalog order."""
    return [
        (op.name, v.name, dt)
        for op in CATALOG.values()
        for v in op.variants
        if include_triton or v.production
        for dt in op.dtypes
    ]


def _finite_real(v: Any) -> float | None:
    """v as a finite float: a Python or numpy int or float alike (np.float32 too); None for anything else
    (bools are not numbers here; nor is an int past float's range)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    try:
        f = float(v)
    except (OverflowError, ValueError):
        return None
    return f if math.isfinite(f) else None


def is_rope_base(base: Any) -> bool:
    """A base rope's tables can use: a finite real number above 1 (1 gives no rotation, below it NaN
    angles)."""
    b = _finite_real(base)
    return b is not None and b > 1


def resolve_params(op: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """The op's params with defaults filled in; unknown names, or params that are not a mapping, are an error."""
    spec = operator(op)
    if params is not None and not isinstance(params, Mapping):
        raise CatalogError(f"{op}: params must be a dict of name -> value, got {type(params).__name__}")
    params = dict(params or {})
    unknown = set(params) - set(spec.params)
    if unknown:
        raise CatalogError(
            f"{op}: unknown params {sorted(unknown, key=repr)}; expected {sorted(spec.params) or 'none'}"
        )
    out = dict(spec.params)
    out.update(params)
    if op == "rope":
        if not is_rope_base(out["base"]):
            raise CatalogError(f"rope: param base must be a finite number > 1, got {out['base']!r:.40}")
        out["base"] = float(out["base"])  # np.float32(10000) and 10000 are the float 10000.0
    if "causal" in out:
        # a flag, not a truthy value: the string "false" would otherwise mask the scores
        c = out["causal"]
        if not (isinstance(c, bool) or type(c).__name__ == "bool_" or (isinstance(c, int) and c in (0, 1))):
            raise CatalogError(f"{op}: param causal must be true or false, got {c!r:.40}")
        out["causal"] = bool(c)
    return out
