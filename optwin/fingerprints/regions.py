"""Feature-space regions: how a sketch maps to the fingerprint cell it belongs to.

    python -c "from optwin.fingerprints.regions import region_of; print(region_of('rmsnorm', {'absmax': 300, 'max_row_rms': 20}))"

Faults are driven by magnitudes and sizes spanning many decades (|x| from 1e-3 to 1e5, positions to
2^21, separations to 1e-9 degrees), so each region feature is binned on a signed log2 grid:
`bin = sign(v) * floor(RES * log2(1 + |v| / SCALE))`. SCALE brings the feature's interesting range
above 1 (separations in degrees are tiny); RES is bins per octave: finer where a boundary is sharp.
The same function runs at build time and in the matcher, so a sketch and its region always agree.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

from optwin.catalog import operator

# feature -> (scale, bins per octave). Unlisted features: (1.0, 1).
# Magnitudes use a tiny SCALE (_TINY, below float32's smallest subnormal): with SCALE 1 every value
# below 1 fell into bin 0, and the faults of tiny inputs (fp16 squares and products going subnormal:
# rmsnorm near rms 1e-4, matmul precision loss) were invisible. Softmax `max` gets 4 bins per
# octave: the naive variant's exp boundaries (11.09 fp16, 88.7 wider) are sharp. `masked_rows` has
# SCALE 1e-6 so that 0 and 1 masked row lie ~20 bins apart: a single fully masked row is a NaN,
# and no neighbour interpolation may blur clean rows into masked ones. `peaked_frac` (softmax,
# attention) is a fraction in [0, 1]; its grid is placed on the low_entropy predicate's edge.
_TINY = 1e-45
_BINNING: dict[str, tuple[float, float]] = {
    "absmax": (_TINY, 2),
    "rms": (_TINY, 2),
    "max_row_rms": (_TINY, 2),
    "max": (1e-3, 4),
    "min_row_max": (1e-3, 4),
    "max_row_range": (1e-3, 2),
    "masked_rows": (1e-6, 1),
    "max_pos": (1.0, 4),
    "score_bound": (_TINY, 2),
    "max_score": (1.0, 4),  # the float16 overflow of q@k^T (65504) sits on the edge of bin 64
    "max_mean_over_std": (1e-3, 2),
    # layernorm's largest constant row: _TINY puts 0 (no constant row) >= 140 bins from any |c| >= 1e-3,
    # so neighbour interpolation never mixes inputs with and without constant rows; 1 bin per octave.
    "const_absmax": (_TINY, 1),
    "const_odd_width": (1e-6, 1),  # a flag: 0 and 1 lie ~20 bins apart, so no interpolation mixes them
    "min_sep_deg": (1e-12, 1),
    "median_sep_deg": (1e-12, 0.5),  # coarse: the typical pair only moves precision loss
    "max_sep_deg": (1e-12, 1),
    "rms_sep_deg": (1e-12, 1),
    "out_bound": (_TINY, 2),
    "seq_k": (1.0, 0.5),  # keys per query: half a bin per octave (1, 3, 15, 63, 255 start the bins)
    # low_entropy holds when MORE than half the rows are peaked: 8 bins per octave with SCALE
    # (0.5 + 1e-9) / 7 put a bin edge just above 0.5 (bin 24 starts there), so a sketch with exactly
    # half its rows peaked shares no cell with the faulting ones; near 0.5 a bin is ~0.05 wide.
    "peaked_frac": ((0.5 + 1e-9) / 7.0, 8),
}

Region = tuple[int, ...]


def _const_odd_width(sketch: Mapping[str, float]) -> float:
    """1.0 when a layernorm input has an exactly constant row with c != 0 and its width is not a power of two.

    Such a row's fp32 mean can miss c: aten's vectorized kernel merges thread counts unevenly (coefficients
    like 2/3 at widths 384 and 768), the one-pass mean multiplies by a rounded 1/n. At a power-of-two width every
    merge coefficient and 1/n is exact, and so is the mean. On an H100 (256 constant rows a width,
    bench/gpu_constant_rows.py) torch's output faults at 384 and 768 and never at 1024..4096, in every dtype.
    Whether the miss happens also depends on c's mantissa, so such cells fault sometimes; without the flag
    they shared cells with the power-of-two widths and warned for all of them (issue #8, seed-4 labels).
    The flag says nothing of the variance: one-pass's E[h^2] sums copies of fp32(c^2), which round at any
    width (the H100 NaNs in 4 to 48 % of float16 rows at 768..4096).
    """
    hidden = int(sketch["hidden"])
    return 1.0 if sketch["const_absmax"] > 0 and hidden & (hidden - 1) else 0.0


# Region features computed from a sketch's other features: never measured or sent by a producer (a sketch
# keeps its contract, SKETCH_FEATURES), added where a sketch is placed on the grid.
DERIVED: dict[str, tuple[tuple[str, Callable[[Mapping[str, float]], float]], ...]] = {
    "layernorm": (("const_odd_width", _const_odd_width),),
}


# Region features whose values are 0 or 1. Their grid puts 0 and 1 ~20 bins apart (no interpolation mixes them),
# so 1's bin starts at 0.524: a flag is shown as its value, not its bin's lower edge (dashboard.data.bin_value).
FLAGS: frozenset[str] = frozenset({"const_odd_width"})


def with_derived(op: str, sketch: Mapping[str, float]) -> Mapping[str, float]:
    """The sketch with the op's derived region features added (the sketch itself when the op has none)."""
    derived = DERIVED.get(op)
    if not derived:
        return sketch
    out = dict(sketch)
    for name, fn in derived:
        out[name] = fn(sketch)
    return out


def region_values(op: str, sketch: Mapping[str, float]) -> tuple[float, ...]:
    """The values of the op's region features in a sketch, derived ones included."""
    sk = with_derived(op, sketch)
    return tuple(float(sk[f]) for f in region_features(op))


_UNLISTED: tuple[float, float] = (1.0, 1)  # the grid of a feature _BINNING does not list


def binning(feature: str) -> tuple[float, float]:
    """(scale, bins per octave) of a region feature: its _BINNING entry, _UNLISTED for another."""
    return _BINNING.get(feature, _UNLISTED)


def feature_bin(feature: str, value: float) -> int:
    scale, res = binning(feature)
    if not math.isfinite(value):
        value = math.copysign(1e300, value) if not math.isnan(value) else 0.0
    b = math.floor(res * math.log2(1.0 + abs(value) / scale))
    return -b if value < 0 else b


def bin_lower_edge(feature: str, b: int) -> float:
    """The smallest |value| that falls in bin b (signed like b): the inverse of `feature_bin`."""
    scale, res = binning(feature)
    mag = scale * (2.0 ** (abs(b) / res) - 1.0)
    return -mag if b < 0 else mag


def region_features(op: str) -> tuple[str, ...]:
    return operator(op).region_features


def grid(op: str) -> dict[str, list]:
    """What decides the op's region keys, as JSON-ready lists: its region features, each one's (scale, bins per
    octave) and the names of its derived features. Builds compare it so that shards binned on two grids are never
    gathered into one database (the matcher refuses such a database)."""
    features = region_features(op)
    return {"features": list(features), "binning": [list(binning(f)) for f in features],
            "derived": [name for name, _ in DERIVED.get(op, ())]}


def region_of(op: str, sketch: Mapping[str, float]) -> Region:
    """The region (bin tuple over the op's region features) a sketch lies in."""
    return tuple(feature_bin(f, v) for f, v in zip(region_features(op), region_values(op, sketch)))


def region_key(region: Region) -> str:
    """Stable text form for storage: '3|-1|10'."""
    return "|".join(str(b) for b in region)


def parse_region_key(key: str) -> Region:
    return tuple(int(b) for b in key.split("|")) if key else ()
