"""The live matcher: per-call fault risk from the fingerprint database, in microseconds.

    python -c "from optwin.fingerprints import Matcher; m = Matcher.open('fingerprints.duckdb'); \
print(m.assess('rmsnorm', 'native-dtype', 'float16', sketch={...}))"

`Matcher.open(db)` reads the current fingerprints once (each (op, variant, dtype) from the newest build that
replayed it: `optwin build --ops rope` renews rope's and keeps the rest), through the store interface
(optwin.fingerprints.store; duckdb is imported there and only at open time), into plain dicts:
(op, variant, dtype) -> region tuple -> probabilities per fault type. `assess` is then pure Python:
validate the sketch, bin it (optwin.fingerprints.regions, the same code the builder binned with),
one dict lookup. No SQL, no torch on the hot path (torch only when tensors are passed, to sketch).

Threshold. `warn` fires when some fault type's probability reaches `MatcherConfig.threshold`,
0.2 by default: a fault that shows in one of five noisy replays of the same input is reproducible
under ordinary run-to-run variation (reduction order, kernel choice), and a missed NaN costs far
more than a spurious warning. `Matcher.calibration()` shows how far the probabilities can be
trusted at that level (Brier score and a reliability table on the build's held-out cases).

Certain faults (`CERTAIN_FAULTS`, per (op, variant)): a sketch feature above 0 that makes a fault certain whatever
its cell says, probability 1 and `known=True`. A sketch that counts non-finite inputs (NaN, ±inf; softmax's -inf
masks are not counted) has `nonfinite` (rule "nonfinite_input"): such an input runs through to the output, and the
builds replay finite inputs only. A softmax sketch with fully masked rows has `nonfinite` (rule "masked_row"):
every softmax variant's twin computes a NaN row there; the builds replay few such cases, so their cells (and the
neighbours answering for the cells they lack) said 0.43-0.9 on a real build.

Sketches outside what was replayed (`known=False`): the conservative rule
  0. the build never replayed the (op, variant, dtype) at all: `MatcherConfig.unbuilt_prior` (0.0:
     the database says nothing about it, and warning on every call of every unbuilt op would drown
     the real warnings; set it to 1.0 to be strict), rule "unbuilt";
  1. the sketch's region was replayed: its probabilities (`known=True`);
  2. otherwise each region feature's bin is first clamped into the triple's replayed bin range.
     If clamping moved a magnitude feature (not a shape: `SHAPE_FEATURES` are only clamped) in its
     fault direction (`FAULT_DIRECTION`: larger |x|, positions, scores, ratios; smaller separations
     for geodesic) the sketch lies beyond everything replayed, rule "beyond": when the edge of the
     range (the clamped cell, by rule 3 if unreplayed) already warns, its probabilities answer (they
     say WHICH fault: past fp16's 65504 rope positions give NaNs, no longer precision loss);
     otherwise every fault type the build saw at all for this triple gets at least
     `MatcherConfig.beyond_prior` (1.0), the others keep the edge's: we do not extrapolate safety;
  3. otherwise the (clamped) region's `MatcherConfig.neighbours` nearest replayed regions
     (Euclidean distance in bins) answer with their inverse-distance weighted mean probability
     (weights also grow with each region's case count), rule "near". A mean rather than a max:
     a max over neighbours warned on every cell next to a fault boundary (precision 0.62 on the
     H200 labels) and made safe flat streams warn. `near_bins` is kept for old configs, unused.
Results of 2-3 are cached per region, so an unknown sketch costs a lookup the second time.

Fault types with their own features (catalog `Operator.fault_features`, e.g. low_entropy of softmax
and attention on `peaked_frac` alone) are answered from a second index over just those features,
whose cells pool the full cells that share them (same rules 1-3 in that smaller space); the others
come from the full cell. Each cell's probability blends the deterministic emulation with the noisy
replays (`MatcherConfig.det_weight`, schema v2's `det_faults`).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from optwin.catalog import CATALOG, check_variant_dtype, operator
from optwin.errors import CatalogError, DatabaseError, SketchError
from optwin.fingerprints.regions import DERIVED, Region, parse_region_key, region_features, with_derived
from optwin.fingerprints.regions import _BINNING, _UNLISTED, binning  # noqa: PLC2701 (same package: the bin grid itself)
from optwin.ingest.sketch import FEATURE_CAP, SIGNED_FEATURES, SKETCH_FEATURES, cap_features, validate_sketch

Triple = tuple[str, str, str]
_log2 = math.log2
log = logging.getLogger("optwin.matcher")

# Fault direction of each region feature: +1 when faults get more likely as it grows, -1 when
# they get more likely as it shrinks (geodesic: the acos variant loses every digit for nearby
# points). Shapes grow accumulation error, so they count as +1 too.
FAULT_DIRECTION: dict[str, int] = {
    "absmax": 1, "max_row_rms": 1, "hidden": 1, "max": 1, "max_row_range": 1, "masked_rows": 1, "n": 1,
    "max_pos": 1, "d": 1, "score_bound": 1, "max_score": 1, "min_row_max": -1, "seq_k": 1, "max_mean_over_std": 1,
    "min_sep_deg": -1, "median_sep_deg": -1, "max_sep_deg": -1, "rms_sep_deg": -1, "out_bound": 1, "k": 1, "rms": 1,
    "const_absmax": 1,  # layernorm's largest constant row: c^2 overflows fp32 (NaN) as |c| grows
    "const_odd_width": 1,  # a constant row's mean can round only at a width that is not a power of two
}
# Shapes are not magnitudes: beyond the replayed sizes the sketch is clamped to the largest replayed
# size (rule 2 applies to magnitudes only; a model wider than the sweep is not a fault by itself).
SHAPE_FEATURES: frozenset[str] = frozenset({"hidden", "n", "d", "seq_k", "k"})
# Rules whose answer is known (Risk.known): a replayed cell, or a certainty that needs none (CERTAIN_FAULTS)
KNOWN_RULES = ("exact", "nonfinite_input", "masked_row")

# Sketch features that make a fault certain when above 0, whatever the cells say: (feature, fault type, rule, why),
# for the (op, variants) named; "*" is every variant. Checked first to last: the first that applies answers.
_CERTAIN: tuple[tuple[str, str, str, dict[str, Any], str], ...] = (
    ("nonfinite", "nonfinite", "nonfinite_input", {op: "*" for op in CATALOG},
     "a NaN or ±inf input runs through to the output; the twins refuse such inputs and the builds replay finite "
     "ones only, so no cell says so"),
    # attention has no mask input and its causal mask keeps key 0 in every row (optwin.twin.attention), so no
    # attention row is ever fully masked: it needs no entry (tests/test_matcher_certain.py checks every variant)
    ("masked_rows", "nonfinite", "masked_row", {"softmax": ("torch", "naive", "triton")},
     "a fully masked row (all -inf) is NaN: torch and triton compute -inf - (-inf), naive 0/0, as optwin.twin.softmax "
     "does for every dtype and for rows past TRITON_WHOLE_ROW_MAX (tests/test_matcher_certain.py)"),
)
CERTAIN_FAULTS: dict[tuple[str, str], tuple[tuple[str, str, str, str], ...]] = {
    (op.name, v): tuple((f, ft, rule, why) for f, ft, rule, where, why in _CERTAIN
                        if where.get(op.name) == "*" or v in where.get(op.name, ()))
    for op in CATALOG.values() for v in op.variant_names
}


@dataclass(frozen=True)
class MatcherConfig:
    """How risks become verdicts. Presets: `MatcherConfig.preset("default" | "sensitive" | "quiet")`."""

    # warn when some fault probability >= this. 0.25 = (1 - det_weight): a cell warns when every noisy
    # replay faults even where the deterministic emulation does not, and no longer when only 80-99 %
    # do. Chosen on the seed-0 H200 labels (stop 12: recall 0.970, precision 0.954 against 0.974 /
    # 0.944 at 0.2; bench/RESULTS.md), then scored on a seed-2 collection made after the choice.
    threshold: float = 0.25
    near_bins: int = 1  # rule 3: how far (in bins) a replayed neighbour may stand in for a sketch
    beyond_prior: float = 1.0  # rule 2: probability beyond the replayed range in the fault direction
    unbuilt_prior: float = 0.0  # rule 0: a triple the build never replayed (known=False either way)
    neighbours: int = 10  # rule 3: replayed regions averaged for a cell the build lacks
    # A cell's probability = det_weight * (share of its cases whose deterministic emulation faults)
    # + (1 - det_weight) * (share of its noisy replays that fault). The device is deterministic:
    # near a boundary noisy replays fault more often than it does (precision 0.77 on H200 labels
    # with replays alone). 0.75 still warns (at 0.25) on a cell where every noisy replay faults and
    # the deterministic emulation does not: run-to-run variation is real on other GPUs and kernels.
    # Chosen on CPU stand-in labels (optwin validate --device cpu), not on the scored GPU labels.
    det_weight: float = 0.75

    @staticmethod
    def preset(name: str) -> "MatcherConfig":
        presets = {"default": MatcherConfig(), "sensitive": MatcherConfig(threshold=0.05, near_bins=2),
                   "quiet": MatcherConfig(threshold=0.5, near_bins=1, beyond_prior=0.5)}
        try:
            return presets[name]
        except KeyError:
            raise CatalogError(f"unknown matcher preset {name!r}; expected one of {', '.join(presets)}") from None


@dataclass(slots=True)
class Risk:
    """The matcher's answer for one call."""

    probability: dict[str, float]  # fault type -> probability in [0, 1]
    warn: bool  # some fault type >= threshold
    known: bool  # False when the sketch's region was never replayed (see the module docstring)
    sketch: dict[str, float]
    region: Region
    rule: str = "exact"  # which rule answered: exact | nonfinite_input | masked_row | unbuilt | beyond | near

    @property
    def max_probability(self) -> float:
        return max(self.probability.values()) if self.probability else 0.0


@dataclass
class TripleIndex:
    """The fingerprints of one (op, variant, dtype): region -> probabilities, plus what rules 2-4 need."""

    triple: Triple
    features: tuple[str, ...]
    fault_types: tuple[str, ...]
    probs: dict[Region, tuple[float, ...]] = field(default_factory=dict)
    n_cases: dict[Region, int] = field(default_factory=dict)
    lo_bin: tuple[int, ...] = ()
    hi_bin: tuple[int, ...] = ()
    _unknown: dict[Region, tuple[tuple[float, ...], str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    grid: tuple[tuple[str, float, int], ...] = ()  # (feature, scale, bins per octave) per region feature
    # fault index -> (positions of its features in `features`, a one-fault index over those features)
    marginals: dict[int, tuple[tuple[int, ...], "TripleIndex"]] = field(default_factory=dict)
    certain: tuple[tuple[str, int, str], ...] = ()  # CERTAIN_FAULTS of the triple: (feature, fault index, rule)
    derived: bool = False  # some region feature is computed from the sketch's others (regions.DERIVED)

    def __post_init__(self) -> None:
        self.grid = tuple((f, *binning(f)) for f in self.features)
        self.derived = any(name in self.features for name, _ in DERIVED.get(self.triple[0], ()))
        self.certain = tuple((f, self.fault_types.index(ft), rule)
                             for f, ft, rule, _ in CERTAIN_FAULTS.get(self.triple[:2], ()) if ft in self.fault_types)

    def coordinates(self, sk: Mapping[str, float]) -> tuple[float, ...]:
        """continuous_bin of every region feature of a validated sketch (the hot path's one pass)."""
        if self.derived:
            sk = with_derived(self.triple[0], sk)
        out = []
        for f, scale, res in self.grid:
            v = sk[f]
            c = res * _log2(1.0 + (v if v >= 0 else -v) / scale)
            out.append(-c if v < 0 else c)
        return tuple(out)

    def finish(self) -> None:
        """Compute the per-feature replayed bin ranges once all regions are in."""
        for _, sub in self.marginals.values():
            sub.finish()
        regs = list(self.probs)
        if regs:
            self.lo_bin = tuple(min(r[i] for r in regs) for i in range(len(self.features)))
            self.hi_bin = tuple(max(r[i] for r in regs) for i in range(len(self.features)))

    def answer(self, region: Region, sk: Mapping[str, float], cfg: MatcherConfig) -> tuple[tuple[float, ...], str]:
        """lookup for a sketch, with the faults no region needs (CERTAIN_FAULTS): a non-finite input runs through
        to the output (rule "nonfinite_input"), a fully masked softmax row is NaN (rule "masked_row"). Such a
        fault has probability 1; the other fault types keep the cell's."""
        probs, rule = self.lookup(region, cfg)
        for f, j, certain_rule in self.certain:
            if sk[f] > 0.0:
                return probs[:j] + (1.0,) + probs[j + 1:], certain_rule
        return probs, rule

    def lookup(self, region: Region, cfg: MatcherConfig) -> tuple[tuple[float, ...], str]:
        """(probabilities in fault_types order, rule) for a region, replayed or not. The rule is the
        full cell's; fault types with their own features (`marginals`) are answered by those."""
        probs, rule = self._lookup_joint(region, cfg)
        if not self.marginals:
            return probs, rule
        out = list(probs)
        for j, (positions, sub) in self.marginals.items():
            out[j] = sub.lookup(tuple(region[i] for i in positions), cfg)[0][0]
        return tuple(out), rule

    def _lookup_joint(self, region: Region, cfg: MatcherConfig) -> tuple[tuple[float, ...], str]:
        p = self.probs.get(region)
        if p is not None:
            return p, "exact"
        hit = self._unknown.get(region)
        if hit is None:
            hit = self._conservative(region, cfg)
            if len(self._unknown) < 65536:  # bounded: a fuzzer must not grow it forever
                with self._lock:
                    self._unknown[region] = hit
        return hit

    def _conservative(self, region: Region, cfg: MatcherConfig) -> tuple[tuple[float, ...], str]:
        nft = len(self.fault_types)
        if not self.probs:
            return (cfg.unbuilt_prior,) * nft, "unbuilt"
        clamped, beyond = [], False
        for i, (f, b) in enumerate(zip(self.features, region)):
            c = min(max(b, self.lo_bin[i]), self.hi_bin[i])
            beyond |= c != b and f not in SHAPE_FEATURES and (b - c) * FAULT_DIRECTION.get(f, 1) > 0
            clamped.append(c)
        reg = tuple(clamped)
        edge = self.probs[reg] if reg in self.probs else self._neighbours(reg, cfg.neighbours)
        if beyond and max(edge, default=0.0) < cfg.threshold:
            # The edge of the replayed range looks safe, but that is no evidence beyond it.
            seen = self._max_over(list(self.probs))
            return tuple(max(e, cfg.beyond_prior) if s > 0 else e for e, s in zip(edge, seen)), "beyond"
        return edge, ("beyond" if beyond else "near")

    def _neighbours(self, reg: Region, k: int) -> tuple[float, ...]:
        """Inverse-distance weighted mean over the k nearest replayed regions (Euclidean, in bins).

        A mean, not a max: the regions around an unreplayed cell disagree exactly where a fault
        boundary runs through it, and the closer side should win; weights grow with a region's
        case count (its estimate is firmer) and fall with the squared distance.
        """
        near = sorted((sum((a - b) ** 2 for a, b in zip(r, reg)), r) for r in self.probs)[:max(k, 1)]
        wsum, acc = 0.0, [0.0] * len(self.fault_types)
        for d2, r in near:
            w = math.sqrt(max(self.n_cases.get(r, 1), 1)) / (1.0 + d2)
            wsum += w
            for j, p in enumerate(self.probs[r]):
                acc[j] += w * p
        return tuple(a / wsum for a in acc)

    def _max_over(self, regs: list[Region]) -> tuple[float, ...]:
        return tuple(max(self.probs[r][j] for r in regs) for j in range(len(self.fault_types)))


def _blend(row: Mapping[str, Any], det_weight: float, source: str = "fingerprint rows") -> float:
    """A fingerprint row's probability: noisy replays blended with the deterministic emulation
    (MatcherConfig.det_weight); rows of schema v1 files without det_faults keep the replays'.

    The row's numbers are checked here, where they are read (DatabaseError naming the row, see from_rows):
    `0 <= x <= hi` is False for NaN, so NaN is refused with the out-of-range values."""
    p = row["probability"]
    if type(p) is not float:  # DuckDB's DOUBLE; an int from a hand-made row is fine, NULL or text is not
        if p is None:
            raise _damaged(source, row, "probability is NULL")
        if not _is_number(p):
            raise _damaged(source, row, f"probability {p!r} is not a number")
        p = float(p)
    if not 0.0 <= p <= 1.0:
        raise _damaged(source, row, f"probability {p!r} is not in [0, 1]")
    det, n = row.get("det_faults"), row.get("n_cases")
    for name, v in (("n_cases", n), ("n_replays", row.get("n_replays"))):
        if v is not None and not (_is_number(v) and v >= 0):
            raise _damaged(source, row, f"{name} {v!r} is not a count (>= 0)")
    if det is not None and not (_is_number(det) and 0 <= det <= (n or 0)):
        raise _damaged(source, row, f"det_faults {det!r} is not a count of at most n_cases ({n!r})")
    if det is None or not n or det_weight <= 0:
        return p
    return det_weight * float(det) / float(n) + (1.0 - det_weight) * p


# Why a row may name what this optwin does not know: said with every such error
_NEWER = "the database may come from a newer optwin (upgrade optwin, or rebuild it with this one: `optwin build`)"


def _damaged(source: str, row: Mapping[str, Any], what: str,
             then: str = "the database is damaged: rebuild it with `optwin build`") -> DatabaseError:
    """The one-line error for a bad fingerprint row: the file, the table, the row's key, what is wrong, what to do."""
    key = "/".join(str(row.get(k)) for k in ("op", "variant", "dtype"))
    build = row.get("build_id")
    return DatabaseError(f"{source}: table fingerprints, row {key} region {row.get('region')!r} fault type "
                         f"{row.get('fault_type')!r}{f' (build {build})' if build else ''}: {what}; {then}")


def _is_number(v: Any) -> bool:
    """An int or float (a DuckDB INTEGER/DOUBLE as Python gives it), not a bool or a text."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _checked_index(triple: tuple[Any, Any, Any], row: Mapping[str, Any], source: str) -> TripleIndex:
    """_new_index for a triple read from the database: names it knows nothing of are a DatabaseError naming the
    file and the row (checked once per triple, not per row)."""
    for what, name in zip(("op", "variant", "dtype"), triple):
        if not isinstance(name, str):
            raise _damaged(source, row, f"{what} is {'NULL' if name is None else repr(name)}")
    try:
        check_variant_dtype(*triple)
    except CatalogError as e:
        raise _damaged(source, row, str(e), _NEWER) from None
    return _new_index(triple)


def _new_index(triple: Triple) -> TripleIndex:
    """An empty index of a triple, with a one-fault index for each fault type the catalog gives its
    own subset of the region features (`Operator.fault_features`)."""
    spec = operator(triple[0])
    ti = TripleIndex(triple, spec.region_features, spec.fault_types)
    for j, ft in enumerate(spec.fault_types):
        own = spec.features_for(ft)
        if own != spec.region_features:
            ti.marginals[j] = (tuple(spec.region_features.index(f) for f in own), TripleIndex(triple, own, (ft,)))
    return ti


def continuous_bin(feature: str, value: float) -> float:
    """The bin coordinate before flooring: `regions.feature_bin(f, v) == trunc(continuous_bin(f, v))`.

    The forecaster follows streams on this log scale, so a trend is in bins per second.
    """
    return continuous_bin_of(value, *binning(feature))


def continuous_bin_of(value: float, scale: float, res: float) -> float:
    """continuous_bin on a feature's (scale, bins per octave)."""
    c = res * math.log2(1.0 + abs(value) / scale)
    return -c if value < 0 else c


def bin_of_coordinate(c: float) -> int:
    """Inverse of continuous_bin's flooring (signed like regions.feature_bin)."""
    b = math.floor(abs(c))
    return -b if c < 0 else b


class Matcher:
    """Fault risk per call and per stream from one build's fingerprints. Thread-safe for reads."""

    def __init__(self, index: dict[Triple, TripleIndex], build_id: str = "", config: MatcherConfig | None = None,
                 path: str | None = None, builds: dict[Triple, str] | None = None) -> None:
        self.index = index
        self.build_id = build_id  # the newest build served
        self.builds = builds or {t: build_id for t in index}  # the build each triple's fingerprints come from
        self.config = config or MatcherConfig()
        self.path = path
        # build id -> the twin version (`builds.twin_version`) that replayed it, for each build served; filled by
        # `open` (rows alone do not say). Fingerprints of other twins are still evidence, so they are served, but
        # they describe numerics the current twins no longer model: `twin_version_mismatch` says so.
        self.twin_versions: dict[str, str] = {}

    @property
    def twin_version_mismatch(self) -> bool:
        """True when some served build was replayed by another twin version than this optwin's TWIN_VERSION."""
        if not self.twin_versions:
            return False
        from optwin.twin import TWIN_VERSION  # torch is loaded already (the sketch needs it): no cost here

        return any(v != TWIN_VERSION for v in self.twin_versions.values())

    # ------------------------------------------------------------------ construction

    @classmethod
    def open(cls, db: Any, config: MatcherConfig | None = None, build_id: str | None = None) -> "Matcher":
        """Load a fingerprint database read-only: each (op, variant, dtype) from the newest build that replayed it
        (so a build of some ops keeps the others' fingerprints), or every triple of the given build_id."""
        from optwin.fingerprints.store import open_store  # duckdb loads here, never on the hot path

        store = open_store(str(db), read_only=True)
        try:
            bid = _current_build_id(store)
            twin = {str(b["build_id"]): str(b.get("twin_version") or "unknown") for b in store.builds()}
            if build_id is None:
                rows = store.current_fingerprints()
            elif build_id in twin:
                bid, rows = build_id, store.fingerprints(build_id)
            else:
                raise DatabaseError(f"{db}: no build {build_id!r} (the newest is {bid})")
        finally:
            store.close()
        m = cls.from_rows(rows, build_id=bid, config=config, source=str(db))
        m.path = str(db)
        m.twin_versions = {b: twin.get(b, "unknown") for b in sorted(set(m.builds.values()) or {bid})}
        if m.twin_version_mismatch:
            _warn_twin_versions(m)
        return m

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], build_id: str = "",
                  config: MatcherConfig | None = None, source: str = "fingerprint rows") -> "Matcher":
        """Build the index from fingerprint rows (the `fingerprints` table's columns, as dicts).

        Every row is checked as it is indexed (`source`, the file, names it in the error): a damaged row raises
        one DatabaseError naming the table, the row's key and what is wrong, never a raw TypeError, and is never
        served (a NaN or 7.0 probability would answer calls as if it were evidence). Bad rows are not skipped
        and counted: the matcher already refuses a database it cannot interpret (another binning, below), the
        sidecar keeps serving its previous index when a reload fails, and a skipped row would silently turn its
        cell into an unreplayed one answered by its neighbours. The load is a loop over row dicts (the store's
        contract), so the checks are a few comparisons inside that loop, not a second pass.
        """
        index: dict[Triple, TripleIndex] = {}
        builds: dict[Triple, str] = {}
        pooled: dict[tuple[Triple, int, Region], list[float]] = {}  # marginal cells: [faults, trials, cases]
        stale: set[str] = set()  # ops (and their builds) whose rows were binned on other region features
        det_weight = (config or MatcherConfig()).det_weight
        for row in rows:
            triple = (row["op"], row["variant"], row["dtype"])
            ti = index.get(triple)
            if ti is None:
                ti = index[triple] = _checked_index(triple, row, source)
                builds[triple] = str(row.get("build_id") or build_id)
            key = row["region"]
            try:
                if type(key) is not str:  # NULL would parse as the empty region (no features)
                    raise TypeError
                region = parse_region_key(key)
            except (ValueError, TypeError):
                raise _damaged(source, row, "region is NULL" if key is None else
                               f"region {key!r} is not a region key (integer bins joined by '|')") from None
            if len(region) != len(ti.features):
                stale.add(f"{triple[0]} (build {builds[triple] or '?'})")  # another binning: not ours to interpret
                continue
            ft = row["fault_type"]
            if ft not in ti.fault_types:
                if ft is None:
                    raise _damaged(source, row, "fault_type is NULL")
                raise _damaged(source, row, f"unknown fault type {ft!r} for {triple[0]} (expected one of "
                                            f"{', '.join(ti.fault_types)})", _NEWER)
            j = ti.fault_types.index(ft)
            probs = list(ti.probs.get(region, (0.0,) * len(ti.fault_types)))
            probs[j] = p = _blend(row, det_weight, source)
            ti.probs[region] = tuple(probs)
            n_cases = int(row.get("n_cases") or 0)
            ti.n_cases[region] = max(ti.n_cases.get(region, 0), n_cases)
            if j in ti.marginals:
                trials = float(row.get("n_replays") or n_cases or 1)
                acc = pooled.setdefault((triple, j, tuple(region[i] for i in ti.marginals[j][0])), [0.0, 0.0, 0])
                acc[0] += p * trials
                acc[1] += trials
                acc[2] += n_cases
        if stale:
            # Answering from the rest would call those ops unbuilt (prior 0: never a warning).
            ops = ", ".join(sorted(stale))
            raise DatabaseError(f"{source}: {ops} binned on other region features than this optwin's (an older "
                                "catalog): rebuild with `optwin build`")
        for (triple, j, sub_region), (faults, trials, n_cases) in pooled.items():
            sub = index[triple].marginals[j][1]
            sub.probs[sub_region] = (faults / trials if trials else 0.0,)
            sub.n_cases[sub_region] = int(n_cases)
        for ti in index.values():
            ti.finish()
        return cls(index, build_id=build_id, config=config, builds=builds)

    # ------------------------------------------------------------------ per call

    def triple_index(self, op: str, variant: str, dtype: str) -> TripleIndex:
        try:
            ti = self.index.get((op, variant, dtype))
        except TypeError:  # an unhashable name (a JSON record's list or object): named below, not "unhashable type"
            ti = None
        if ti is None:
            for what, name in (("op", op), ("variant", variant), ("dtype", dtype)):
                if not isinstance(name, str):
                    raise CatalogError(f"{what} must be a string, got {type(name).__name__}")
            check_variant_dtype(op, variant, dtype)  # unknown names: CatalogError naming them
            ti = self.index[(op, variant, dtype)] = _new_index((op, variant, dtype))
        return ti

    def assess(self, op: str, variant: str, dtype: str, inputs: Mapping[str, Any] | None = None,
               params: Mapping[str, Any] | None = None, sketch: Mapping[str, Any] | None = None) -> Risk:
        """Risk of one call, from its tensors (sketched here) or a precomputed sketch."""
        ti = self.triple_index(op, variant, dtype)
        return self.assess_valid(ti, call_sketch(op, dtype, inputs, params, sketch, "assess"))

    def assess_valid(self, ti: TripleIndex, sk: dict[str, float]) -> Risk:
        """assess for a sketch already validated: the hot path (dict lookups only)."""
        if ti.derived:
            sk = dict(with_derived(ti.triple[0], sk))  # Risk.sketch holds what was matched, derived features too
        region = tuple(_bin(f, sk[f]) for f in ti.features)
        probs, rule = ti.answer(region, sk, self.config)
        thr = self.config.threshold
        return Risk(dict(zip(ti.fault_types, probs)), max(probs, default=0.0) >= thr, rule in KNOWN_RULES, sk, region,
                    rule)

    def max_probability_at(self, ti: TripleIndex, region: Region) -> float:
        probs, _ = ti.lookup(region, self.config)
        return max(probs, default=0.0)

    # ------------------------------------------------------------------ per stream

    def stream(self, name: str, op: str, variant: str, dtype: str, forecast: Any = None, sampling: Any = None):
        """A stream of calls of one op site: per-call risk plus a forecast of where it drifts."""
        from optwin.fingerprints.forecast import Stream

        self.triple_index(op, variant, dtype)
        return Stream(self, name, op, variant, dtype, config=forecast, sampling=sampling)

    # ------------------------------------------------------------------ calibration

    def calibration(self, bins: int = 10) -> dict[str, Any]:
        """Brier score and reliability table of the probabilities on the build's held-out cases.

        Each held-out case (kept out of the fingerprints by the builder) is assessed from its stored
        sketch; its observed outcome per fault type is the fraction of its replays that faulted
        (its deterministic flag when it had no replays). Returned: n, per fault type the Brier score
        and the base-rate Brier (always predicting the held-out base rate), the skill 1 - brier/base,
        and one reliability table over all fault types: per predicted-probability bin, count, mean
        predicted, mean observed.
        """
        if self.path is None:
            raise CatalogError("calibration needs a matcher opened from a database (Matcher.open)")
        from optwin.fingerprints.store import open_store

        store = open_store(self.path, read_only=True)
        try:  # each triple's held-out cases from the build its fingerprints come from
            rows = [r for b in sorted(set(self.builds.values()) or {self.build_id}) for r in store.held_out_cases(b or None)
                    if self.builds.get((r["op"], r["variant"], r["dtype"]), self.build_id) == b]
        finally:
            store.close()
        return calibration_table(self, (held_out_row(r) for r in rows), bins)


def calibration_table(m: Matcher, held: Iterable[Mapping[str, Any]], bins: int = 10) -> dict[str, Any]:
    """The calibration report from held-out rows {op, variant, dtype, sketch, observed: {fault: frac}}."""
    pairs: dict[str, list[tuple[float, float]]] = {}
    unknown = 0
    n = 0
    for row in held:
        op, variant, dtype = row["op"], row["variant"], row["dtype"]
        try:
            risk = m.assess(op, variant, dtype, sketch=row["sketch"])
        except (SketchError, CatalogError):
            continue
        n += 1
        unknown += not risk.known
        for ft, y in row["observed"].items():
            if y is None or ft not in risk.probability:
                continue
            pairs.setdefault(ft, []).append((risk.probability[ft], float(y)))
    per_type = {}
    for ft, ps in pairs.items():
        base = sum(y for _, y in ps) / len(ps)
        brier = sum((p - y) ** 2 for p, y in ps) / len(ps)
        base_brier = sum((base - y) ** 2 for _, y in ps) / len(ps)
        per_type[ft] = {"n": len(ps), "brier": brier, "base_rate": base, "base_brier": base_brier,
                        "skill": (1.0 - brier / base_brier) if base_brier > 0 else None}
    table = []
    allp = [pr for ps in pairs.values() for pr in ps]
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        sel = [(p, y) for p, y in allp if lo <= p < hi or (b == bins - 1 and p == 1.0)]
        if sel:
            table.append({"bin": f"[{lo:.1f}, {hi:.1f}{']' if b == bins - 1 else ')'}", "n": len(sel),
                          "mean_predicted": sum(p for p, _ in sel) / len(sel),
                          "mean_observed": sum(y for _, y in sel) / len(sel)})
    total = sum((p - y) ** 2 for p, y in allp) / len(allp) if allp else None
    return {"build_id": m.build_id, "n_cases": n, "n_unknown": unknown, "brier": total,
            "per_fault_type": per_type, "reliability": table}


def fast_validate_sketch(op: str, sketch: Any) -> dict[str, float]:
    """`optwin.ingest.validate_sketch` with a fast path for the common case (a dict of plain floats).

    The fast path accepts exactly what validate_sketch accepts for float/int values; anything else
    (bools, strings, numpy scalars, NaN, a missing feature) goes to validate_sketch itself, which
    accepts it or raises its one-line SketchError, so both paths agree.
    """
    names = SKETCH_FEATURES.get(op)
    if names is None or type(sketch) is not dict:
        return validate_sketch(op, sketch)
    out = {}
    try:
        for n in names:
            v = sketch[n]
            tv = type(v)
            if tv is int:
                v = float(v)
            elif tv is not float:
                return validate_sketch(op, sketch)
            if not (0.0 <= v <= FEATURE_CAP or (n in SIGNED_FEATURES and -FEATURE_CAP <= v <= FEATURE_CAP)):
                return validate_sketch(op, sketch)  # NaN, inf, negative or past the cap: refused or clamped there
            out[n] = v
    except (KeyError, OverflowError):
        return validate_sketch(op, sketch)
    if op in _RANGED and (("causal" in out and out["causal"] not in (0.0, 1.0)) or out.get("masked_frac", 0.0) > 1.0
                          or out.get("peaked_frac", 0.0) > 1.0 or out.get("base", 2.0) <= 1.0):
        return validate_sketch(op, sketch)
    return out


# ops whose sketch has a feature with a range of its own (validate_sketch's flag, fractions and rope's base)
_RANGED = frozenset(op for op, names in SKETCH_FEATURES.items()
                    if {"causal", "masked_frac", "peaked_frac", "base"} & set(names))


def call_sketch(op: str, dtype: str, inputs: Mapping[str, Any] | None, params: Mapping[str, Any] | None,
                sketch: Mapping[str, Any] | None, caller: str) -> dict[str, float]:
    """The validated sketch of one call, given either its tensors (sketched here, each in the call's dtype as
    the catalog has it: rope's positions int64) or a precomputed sketch, never both."""
    if sketch is not None:
        if inputs is not None:
            raise SketchError(f"{op}: {caller} takes inputs (tensors) or a sketch, not both")
        return fast_validate_sketch(op, sketch)
    if inputs is None:
        raise SketchError(f"{op}: {caller} needs inputs (tensors) or a sketch")
    from optwin.ingest.sketch import sketch as compute_sketch
    from optwin.validation import check_dtypes

    if isinstance(inputs, Mapping):  # anything else: the sketch's own check_names says what it wants
        check_dtypes(operator(op), dtype, inputs, present_only=True)
    sk = compute_sketch(op, inputs, dict(params or {}))
    # A sketch of tensors is taken over finite elements, yet a magnitude can still pass FEATURE_CAP or float64
    # (a bound multiplies norms): clamped as validate_sketch clamps a received sketch (cap_features says why).
    # NaN has no region: refused, as validate_sketch refuses it (cap_features leaves it to us).
    for n, v in sk.items():
        if v != v:
            raise SketchError(f"{op}: sketch feature {n} is NaN")
    return cap_features(sk)


def _bin(feature: str, value: float) -> int:
    """regions.feature_bin for a validated (finite) value, inlined for the hot path."""
    scale, res = _BINNING.get(feature, _UNLISTED)  # regions.binning, without the call
    b = math.floor(res * math.log2(1.0 + abs(value) / scale))
    return -b if value < 0 else b


def held_out_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A `held_out_cases` row -> {op, variant, dtype, sketch, observed: {fault type: fraction}}.

    Observed = faulting replays / replays; the deterministic flag when the case had no replays.
    """
    import json

    sk = row["sketch"]
    reps = int(row.get("replays") or 0)
    observed: dict[str, float | None] = {}
    for ft in operator(str(row["op"])).fault_types:
        n, det = row.get(f"n_{ft}"), row.get(f"det_{ft}")
        if reps > 0 and n is not None:
            observed[ft] = float(n) / reps
        else:
            observed[ft] = None if det is None else float(bool(det))
    return {"op": row["op"], "variant": row["variant"], "dtype": row["dtype"],
            "sketch": json.loads(sk) if isinstance(sk, str) else sk, "observed": observed}


def _warn_twin_versions(m: Matcher) -> None:
    """Say once per load (through the optwin loggers, as the sidecar and monitor report) that some served
    fingerprints were replayed by another twin version: `optwin build --ops` renews some ops and keeps the rest,
    so one database can mix versions, and nothing else reads `builds.twin_version`."""
    from optwin.twin import TWIN_VERSION

    old = ", ".join(f"build {b} (twin version {v})" for b, v in m.twin_versions.items() if v != TWIN_VERSION)
    log.warning("%s: serving fingerprints replayed by other twins than this optwin's (twin version %s): %s; they "
                "are still served as evidence, but rebuild (`optwin build`) to replay them with the current twins",
                m.path, TWIN_VERSION, old)


def _current_build_id(store: Any) -> str:
    bid = store.latest_build_id()
    if bid is None:
        raise DatabaseError(f"the fingerprint database {store.path} holds no build: run `optwin build`")
    return str(bid)


__all__ = ["Matcher", "MatcherConfig", "Risk", "TripleIndex", "FAULT_DIRECTION", "CERTAIN_FAULTS", "continuous_bin",
           "fast_validate_sketch", "calibration_table", "region_features"]
