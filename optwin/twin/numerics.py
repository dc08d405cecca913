"""Precision emulation over float64 tensors: formats, rounding, ordered float32 reductions, noise.

    python -m pytest tests/test_twin_numerics.py

Every twin computes on float64 tensors and calls `Numerics.round` at each point where the real
implementation rounds. A value's float64 representation is exact for every emulated format, so a
rounded float64 tensor *is* the low-precision value.

Noise modes (one input -> a distribution of outcomes, R replays batched in a leading dim):
- `none`: deterministic IEEE round-to-nearest-even: the emulated output.
- `stochastic`: stochastic rounding at every rounded operation: round up with probability equal to
  the distance from the lower neighbour in ulps. Only the two neighbours are ever picked.
- `mca`: Monte-Carlo arithmetic in Verificarlo's random-rounding mode: the exact result is perturbed
  by `2^(e - t) * xi`, xi ~ U(-1/2, 1/2), e the exponent of the result (held at the format's smallest
  normal's for a subnormal result, whose spacing is fixed), t the virtual precision
  (the format's precision by default), and then rounded to nearest in the format, which keeps
  overflow and underflow physical. A result already representable at precision t is not perturbed.
- `order`: every reduction takes a random order (a random permutation of its elements) and a random
  block width; rounding itself stays round-to-nearest-even.
Seeds are reproducible: the same seed gives the same replays. Each replay draws from its own
generator (`ReplayDraws`), so a replay's numbers do not depend on how many replays run beside it:
twin.run splits many replays into batches and gets the replays of one unbatched run, bit for bit.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

NOISE_MODES = ("none", "stochastic", "mca", "order")

# The row order of our Triton norms (optwin.kernels.rmsnorm / layernorm), part of their numerics: a
# row of up to TRITON_WHOLE_ROW_MAX elements is held in registers and each sum is one tree; a longer
# row is read in TRITON_CHUNK-wide pieces, each sum one fp32 accumulator per lane (lane l: elements
# l, l + CHUNK, ... in sequence), then a tree over the lanes. The kernels take both from here.
TRITON_WHOLE_ROW_MAX = 65536
TRITON_CHUNK = 4096
# The Triton kernels' exp(d) is ex2.approx(d * LOG2E_F32): log2(e) rounded to float32 (0x3FB8AA3B), the
# factor of optwin.kernels._common.exp_ftz (its PTX spells it out) and of the twin's model of it.
LOG2E_F32 = 1.44269502162933349609375
# Triton layernorm rows of 4096..65536 that a chunk of WELFORD_CHUNKS divides into at least 3 pieces
# take the Welford layout (optwin.kernels.layernorm_welford, as torch.compile runs
# layernorm): lane l of the chunk runs Welford's update over elements l, l + chunk, ... (1/count
# rounded once per piece, each update an FMA), then a tree of Chan merges; a second pass normalizes.
# The largest such chunk: H200 bf16 sweeps over widths 4096..65536 (bench/results/layernorm_welford_h200_s20*.md)
# found it at or near the best launch everywhere, 1.1-1.6x torch.compile; other rows stay in registers.
WELFORD_CHUNKS = (4096, 2048, 1024)


def welford_chunk(n: int) -> int:
    """The lanes of the Triton layernorm's Welford layout for a row of n, or 0: the row is held in
    registers (two-pass trees) or read in TRITON_CHUNK pieces past TRITON_WHOLE_ROW_MAX."""
    if n < 4096 or n > TRITON_WHOLE_ROW_MAX:
        return 0
    return next((c for c in WELFORD_CHUNKS if n % c == 0 and n // c >= 3), 0)


def fma_odd(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c for float32 values held in float64, rounded to odd in float64: rounding that to
    float32 (num.round) gives the correctly rounded fused multiply-add. a * b is exact in float64 (48
    bits); the sum can round there (factors far apart in exponent), and rounding twice to nearest then
    differs from one FMA at ties (seen: a Welford mean near 300 one float32 ulp off). Rounding to odd
    first is innocuous for any later rounding to 24 bits (53 >= 24 + 2)."""
    p = a * b
    s = p + c
    bp = s - c
    err = (p - bp) + (c - (s - bp))  # TwoSum: s + err == p + c exactly
    inexact_even = (err != 0) & (s.view(torch.int64) & 1 == 0) & torch.isfinite(s)
    toward = torch.where(err > 0, torch.full_like(s, float("inf")), torch.full_like(s, -float("inf")))
    return torch.where(inexact_even, torch.nextafter(s, toward), s)


def sum_squares(num: Numerics, x: torch.Tensor) -> torch.Tensor:
    """The Triton norms' row sum of x*x (keepdim, float32) over rows past TRITON_WHOLE_ROW_MAX, read in
    TRITON_CHUNK pieces: every product rounded, each lane summing its elements over the chunks in sequence,
    then a tree (the order "blocked"). A row held whole folds FMAs and sums in the kernel's layout:
    optwin.twin.triton_reduce.sum_squares, the only model of it."""
    n = x.shape[-1]
    if n <= TRITON_WHOLE_ROW_MAX:  # a second, unchecked model of the held-whole rows would drift (s49 review)
        raise ValueError(f"sum_squares models rows past {TRITON_WHOLE_ROW_MAX} read in chunks, not a row of {n}: "
                         "rows held whole are optwin.twin.triton_reduce.sum_squares")
    return num.sum(num.round(x * x, "float32"), order="blocked", lanes=TRITON_CHUNK, keepdim=True)


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: precision p (significand bits, implicit bit included)."""

    name: str
    p: int
    emin: int  # exponent of the smallest normal number
    emax: int  # exponent of the largest finite number
    overflow: str = "inf"  # "inf" (IEEE), "saturate" (torch's float8_e4m3fn cast), "nan"
    torch_dtype: torch.dtype | None = None

    @property
    def max(self) -> float:
        return (2.0 - 2.0 ** (1 - self.p)) * 2.0**self.emax if self.name != "float8_e4m3fn" else 448.0

    @property
    def tiny(self) -> float:
        """Smallest positive normal."""
        return 2.0**self.emin

    @property
    def u(self) -> float:
        """Unit roundoff."""
        return 2.0**-self.p

    def ulp(self, x: torch.Tensor) -> torch.Tensor:
        """Spacing of the format at |x| (float64), the subnormal spacing below tiny."""
        _, e = torch.frexp(x.abs())
        exp = torch.clamp(e - 1, min=self.emin)
        return torch.exp2((exp - (self.p - 1)).to(torch.float64))


FORMATS: dict[str, Format] = {
    "float16": Format("float16", 11, -14, 15, "inf", torch.float16),
    "bfloat16": Format("bfloat16", 8, -126, 127, "inf", torch.bfloat16),
    "float32": Format("float32", 24, -126, 127, "inf", torch.float32),
    # TF32: float32's range with float16's precision (tensor-core inputs under allow_tf32).
    "tf32": Format("tf32", 11, -126, 127, "inf", None),
    # e4m3fn has no infinity; its largest value is 448 (S.1111.110). torch's cast saturates
    # out-of-range values (inf included) to +-448 and keeps NaN: we model torch's cast.
    "float8_e4m3fn": Format("float8_e4m3fn", 4, -6, 8, "saturate", torch.float8_e4m3fn),
    "float8_e5m2": Format("float8_e5m2", 3, -14, 15, "inf", torch.float8_e5m2),
}


def fmt(name: str | Format) -> Format:
    if isinstance(name, Format):
        return name
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; expected one of {', '.join(FORMATS)}") from None


def _scale_exponent(a: torch.Tensor, f: Format) -> torch.Tensor:
    """Exponent of the ulp of |a| in format f (subnormals share emin's ulp)."""
    _, e = torch.frexp(a)
    return torch.clamp(e - 1, min=f.emin) - (f.p - 1)


def _finish(x: torch.Tensor, mag: torch.Tensor, f: Format, ftz: bool) -> torch.Tensor:
    """Apply overflow, flush-to-zero, the sign (keeping -0.0) and NaN/Inf pass-through."""
    over = mag > f.max
    if f.overflow == "inf":
        mag = torch.where(over, torch.full_like(mag, math.inf), mag)
    elif f.overflow == "saturate":
        mag = torch.where(over | torch.isinf(x), torch.full_like(mag, f.max), mag)
    else:
        mag = torch.where(over | torch.isinf(x), torch.full_like(mag, math.nan), mag)
    if ftz:
        mag = torch.where(mag < f.tiny, torch.zeros_like(mag), mag)
    out = torch.copysign(mag, x)
    if f.overflow == "inf":
        out = torch.where(torch.isinf(x), x, out)
    return torch.where(torch.isnan(x), x, out)


def round_nearest(x: torch.Tensor, f: Format | str, ftz: bool = False) -> torch.Tensor:
    """IEEE round-to-nearest-even of float64 `x` into format `f`, computed exactly in float64.

    One rounding from the float64 value (the IEEE definition). torch's own `double.to(half)` goes
    through float32 first (two roundings); see `torch_cast` for that behaviour.
    """
    f = fmt(f)
    x = x.to(torch.float64)
    a = x.abs()
    if ftz:  # denormals-are-zero on the way in, as FTZ hardware does
        a = torch.where(a < f.tiny, torch.zeros_like(a), a)
    s = _scale_exponent(a, f)
    # a * 2^-s is exact (power-of-two scaling); torch.round is round-half-to-even.
    mag = torch.ldexp(torch.round(torch.ldexp(a, -s)), s)
    return _finish(x, mag, f, ftz)


def _mix64(v: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit integers that scatters neighbouring ones."""
    v = (v + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    v = ((v ^ (v >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    v = ((v ^ (v >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return v ^ (v >> 31)


def replay_seed(seed: int, replay: int) -> int:
    """The seed of replay `replay`'s generator in a run seeded `seed`. The replays of one run get
    distinct seeds even in their low 32 bits, all that torch's CPU generator (mt19937) keeps."""
    return (_mix64(seed) + replay) & (2**63 - 1)


class ReplayDraws:
    """The element-wise random draws of replays first .. first + count - 1 of a run, one generator each.

    A draw shaped (count, ...) (a tensor carrying the leading replay dim) takes its row i from replay
    first + i's own generator, so what a replay draws does not depend on the batch it runs in. A draw
    of any other shape (a tensor without the replay dim, e.g. a 0-d constant) comes from the shared
    generator, seeded alike in every batch and drawn in the same sequence. Under replays a twin must
    therefore round only tensors that carry the replay dim or have no dims at all.

    Every element of a per-replay draw is one random64 of its replay's generator (two mt19937 words):
    torch's CPU `random_(0, high)` takes random64 % high for high >= 2^28 and `uniform_()` of float64
    takes (random64 & (2^53 - 1)) * 2^-53 (ATen's DistributionsHelper.h / TransformationHelper.h). A
    long draw is drawn row by row as it always was; short ones, where `count` generator calls a draw
    cost more than the numbers, are cut from a block of each stream drawn ahead (`random_()`: random64
    % 2^63, its low bits those of random64). Either way the numbers are a row-by-row `random_(0, high)`
    / `uniform_()`'s bit for bit: how far ahead a block reaches changes only what the end of a run
    throws away, never a number."""

    LONG = 1024  # a draw of at least this many elements per replay is drawn for itself, straight into its tensor
    AHEAD_MIN = 256  # a shorter one is cut from a block drawn ahead: at least this many elements beyond it,
    AHEAD_MAX = 2048  # at most this many (however many were drawn so far): what the end of a run throws away
    AHEAD_BYTES = 1 << 25  # and at most this much memory over all replays of the batch (int64 each)

    def __init__(self, seed: int, first: int, count: int, shared: torch.Generator, device: torch.device | str = "cpu"):
        self.count = count
        self.shared = shared
        self.gens = [torch.Generator(device=device).manual_seed(replay_seed(seed, first + i)) for i in range(count)]
        self._buf = torch.empty((count, 0), dtype=torch.int64, device=device)  # (count, B) random_() values
        self._pos = 0  # the next value of every stream is column _pos of _buf
        self._drawn = 0

    def _per_replay(self, shape: tuple[int, ...]) -> bool:
        return len(shape) >= 1 and shape[0] == self.count

    def draw(self, shape: tuple[int, ...], high: int | None) -> torch.Tensor:
        """The next numel / count elements of each replay's stream, as a tensor of `shape` (count, ...)
        whose row i is replay first + i's: int64 in [0, high) as `random_(0, high)` draws them (high a
        power of two in [2^28, 2^62]), or with high None float64 in [0, 1) as `uniform_()` does."""
        k = math.prod(shape[1:])
        left = self._buf.shape[1] - self._pos
        if left < k and k >= self.LONG:  # drawn for itself: what was left over, then each stream's next
            out = torch.empty((self.count, k), dtype=torch.int64 if high else torch.float64, device=self._buf.device)
            rows = out
            if left:
                out[:, :left] = self._cut(left, high)
                rows = out[:, left:]
            if high:
                for row, g in zip(rows.unbind(0), self.gens):
                    row.random_(0, high, generator=g)
            else:
                for row, g in zip(rows.unbind(0), self.gens):
                    row.uniform_(generator=g)
            return out.view(shape)
        if left < k:
            ahead = min(self.AHEAD_MAX, max(self.AHEAD_MIN, self._drawn), self.AHEAD_BYTES // (8 * self.count))
            block = torch.empty((self.count, k + ahead), dtype=torch.int64, device=self._buf.device)
            if left:
                block[:, :left] = self._buf[:, self._pos:]
            for row, g in zip(block[:, left:].unbind(0), self.gens):
                row.random_(generator=g)  # random64 % 2^63: the 53 (uniform) or log2(high) low bits are kept
            self._drawn += k + ahead - left
            self._buf, self._pos = block, 0
        return self._cut(k, high).view(shape)

    def _cut(self, k: int, high: int | None) -> torch.Tensor:
        """The next k values of the block drawn ahead, (count, k), transformed as `draw` says."""
        r = self._buf[:, self._pos:self._pos + k]
        self._pos += k
        if high:
            return torch.bitwise_and(r, _mask(high - 1))
        return torch.bitwise_and(r, _mask(_U53)).to(torch.float64).mul_(2.0**-53)


_U53 = (1 << 53) - 1


@functools.lru_cache(maxsize=64)
def _mask(mask: int) -> torch.Tensor:
    """A 0-d int64 tensor of `mask` (a tensor operand dispatches faster than a Python int)."""
    return torch.tensor(mask, dtype=torch.int64)


def _uniform(gen: torch.Generator | ReplayDraws, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """U[0, 1) float64 of `shape`: from `gen`, or per replay row (ReplayDraws), as torch's `uniform_()`."""
    if isinstance(gen, ReplayDraws):
        if not gen._per_replay(shape):
            return torch.rand(shape, generator=gen.shared, dtype=torch.float64, device=device)
        return gen.draw(shape, None)
    return torch.rand(shape, generator=gen, dtype=torch.float64, device=device)


def _integers(gen: torch.Generator | ReplayDraws, high: int, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Uniform int64 in [0, high) of `shape`: from `gen`, or per replay row (ReplayDraws), as torch's
    `random_(0, high)`. Per replay, high is a power of two in [2^28, 2^62] (round_stochastic's 2^(53 - p))."""
    if isinstance(gen, ReplayDraws):
        if not gen._per_replay(shape):
            return torch.randint(0, high, shape, generator=gen.shared, dtype=torch.int64, device=device)
        if high & (high - 1) or not 1 << 28 <= high <= 1 << 62:
            raise ValueError(f"per-replay integers in [0, {high}): high must be a power of two in [2^28, 2^62]")
        return gen.draw(shape, high)
    return torch.randint(0, high, shape, generator=gen, dtype=torch.int64, device=device)


def round_stochastic(x: torch.Tensor, f: Format | str, gen: torch.Generator | ReplayDraws, ftz: bool = False) -> torch.Tensor:
    """Stochastic rounding: the upper neighbour with probability (|x| - lo) / ulp, else the lower."""
    f = fmt(f)
    x = x.to(torch.float64)
    if ftz or f.overflow != "inf":
        return _round_stochastic_scaled(x, f, gen, ftz)
    # Bit arithmetic on the float64 pattern (sign-magnitude): adding r ~ U{0 .. 2^D - 1} to the
    # D = 53 - p dropped bits carries into the kept ones with probability (dropped bits) / 2^D,
    # exactly the distance to the lower neighbour in ulps; the carry crosses binades (and into
    # the exponent up to inf) by itself. Below the smallest normal the ulp is fixed: a plain grid.
    d = 53 - f.p
    r = _integers(gen, 1 << d, tuple(x.shape), x.device)
    up = ((x.view(torch.int64) + r) & ~((1 << d) - 1)).view(torch.float64)
    a = x.abs()
    if not float(a.amin()) >= f.tiny:  # zeros (and NaN) land here too; both paths keep them
        step = 2.0 ** (f.emin - f.p + 1)  # the subnormal spacing
        u = r.to(torch.float64) * 2.0**-d  # the same draw as a uniform in [0, 1)
        sub = torch.copysign(torch.floor(a / step + u) * step, x)
        up = torch.where(a < f.tiny, sub, up)
    if not float(a.amax()) <= f.max:  # overflow possible, or inf / NaN inputs (NaN fails <=)
        up = torch.where(up.abs() > f.max, torch.copysign(torch.full_like(up, math.inf), x), up)
        up = torch.where(torch.isfinite(x), up, x)
    return up


def _round_stochastic_scaled(x: torch.Tensor, f: Format, gen: torch.Generator | ReplayDraws, ftz: bool) -> torch.Tensor:
    """The general path (any overflow rule, flush-to-zero): scale by the ulp, floor, draw."""
    a = x.abs()
    s = _scale_exponent(a, f)
    scaled = torch.ldexp(a, -s)
    lo = torch.floor(scaled)
    frac = scaled - lo
    up = _uniform(gen, tuple(a.shape), a.device) < frac
    mag = torch.ldexp(lo + up.to(torch.float64), s)
    return _finish(x, mag, f, ftz)


def perturb_mca(x: torch.Tensor, f: Format | str, gen: torch.Generator | ReplayDraws, t: int | None = None) -> torch.Tensor:
    """Verificarlo random-rounding MCA: x + 2^(e_x - t) * xi, xi ~ U(-1/2, 1/2), at virtual precision t.

    A value already representable at the virtual precision (t significand bits on the format's grid,
    whose spacing stops shrinking below its smallest normal) is left as it is, as Verificarlo's RR
    mode does (interflop_mca.c: `mode == rr && _IS_REPRESENTABLE(x, t)`): an exact result has no
    rounding error to randomize (perturbing it would move an exact 1024.0 to 1023.5 in float16 a
    quarter of the time). NaN, inf and 0 pass through; the draw is made for every element either way.

    Below the format's smallest normal the exponent is held at the format's emin (e_x = emin + 1), as
    the format's spacing is: a subnormal result is perturbed by up to half the subnormal ulp at
    precision t (2^(emin - t + 1) / 2), not by half an ulp of its own float64 exponent, which is
    far under the grid and rounded straight back off (no spread at all where fp16 softmax outputs
    fell below 2^-14). Normal results keep e_x, so their replays stay what they were."""
    f = fmt(f)
    t = f.p if t is None else t
    x = x.to(torch.float64)
    a = x.abs()
    _, e = torch.frexp(a)  # |x| = m 2^e, m in [0.5, 1): Verificarlo's e_x
    e = torch.clamp(e, min=f.emin + 1)  # subnormals share the spacing at emin (see above)
    xi = _uniform(gen, tuple(x.shape), x.device) - 0.5
    noise = torch.ldexp(xi, (e - t).to(torch.int64))
    scaled = torch.ldexp(a, -((e - 1) - (t - 1)))  # |x| in units of the grid's spacing
    inexact = scaled != torch.floor(scaled)  # False for NaN and inf too (they keep x below)
    y = x + noise
    # Held at the smallest spacing, a subnormal's noise can outweigh it (at t < p up to 2^(p-t-1) subnormal
    # ulps): crossing zero would give a result of the other sign (a negative softmax probability), which no
    # rounding of x gives. It stops at a zero of x's sign instead. A normal x's noise is below |x|: unchanged.
    y = torch.where(y * x < 0, torch.copysign(torch.zeros_like(y), x), y)
    return torch.where(torch.isfinite(x) & (x != 0) & inexact, y, x)


def scalar32(v: float) -> float:
    """A Python float as float32 arithmetic sees it: rounded once to float32. torch wraps a Python
    scalar beside a float32 (or, on CUDA, a half/bfloat16: opmath float32) tensor in the op's float32
    type, and a Triton kernel takes a float argument as an fp32 scalar, so `v + eps` adds fp32(eps)."""
    return float(round_nearest(torch.tensor(float(v), dtype=torch.float64), FORMATS["float32"]))


@functools.lru_cache(maxsize=1024)  # every mean of every twin run asks: a few shapes, asked again and again
def cuda_mean_factor(rows: int, n: int) -> float:
    """The float32 factor CUDA's torch.mean multiplies its accumulator by, for `rows` means over n:
    `static_cast<float>(num_output_elements) / numel` on the host (ReduceMomentKernel.cu,
    mean_kernel_impl), float32 over float32. That is fp32(1/n) while rows * n is a float32 integer;
    past 2^24 elements numel may round first (4097 rows of 4097: one ulp above fp32(1/4097))."""
    return scalar32(scalar32(rows) / scalar32(rows * n))  # the float64 quotient of two floats rounds once, correctly


def torch_cast(x: torch.Tensor, f: Format | str) -> torch.Tensor:
    """What `x.to(dtype).double()` gives for a float64 `x` in torch: float32 first, then the format.

    Formats without a torch dtype (tf32) round once, from float32.
    """
    f = fmt(f)
    x32 = round_nearest(x, FORMATS["float32"])
    return x32 if f.name == "float32" else round_nearest(x32, f)


# ReduceConfig splits a row over several blocks only while the grid stays under the SMs' worth of 512-thread blocks
# (132 SMs x 4 on an H100 or H200).
_CUDA_GRID_TARGET = 528


@functools.lru_cache(maxsize=256)
def _cuda_reduce_index(n: int, threads: int, accs: int, vectorized: bool, shift: int) -> torch.Tensor:
    """Which element of a row of n each of `threads` threads adds into each of its `accs` accumulators at each step
    (Numerics._cuda_reduce): a long tensor (accs, steps, threads), n where a thread adds nothing (the zero pad).
    Vectorized rows (vec = accs elements a vector): the head before the row's first 16-byte boundary (`shift`
    elements into an aligned vector), then the whole vectors, then the tail past the last whole vector, head and
    tail into accumulator 0. Element-wise rows: accumulator j takes t + j T + 4 k T."""
    t = torch.arange(threads)
    if not vectorized:
        steps = -(-n // (accs * threads))
        idx = t + threads * (torch.arange(accs)[:, None, None] + accs * torch.arange(steps)[None, :, None])
        return torch.where(idx < n, idx, n)  # (accs, steps, threads)
    head = (accs - shift) % accs  # elements before the first aligned vector
    body = n - head
    vectors = body // accs
    steps = -(-vectors // threads)
    v = t + threads * torch.arange(steps)[:, None]  # (steps, threads) vector index
    main = head + v * accs + torch.arange(accs)[:, None, None]  # (accs, steps, threads)
    main = torch.where(v < vectors, main, n)
    parts = [main]
    if head:  # thread shift + i reads the row's element i, first
        first = torch.full((accs, 1, threads), n)
        lanes = torch.arange(shift, accs)
        first[0, 0, lanes] = lanes - shift
        parts.insert(0, first)
    tail = body - vectors * accs
    if tail:  # thread t the t-th element past the last whole vector, last
        last = torch.full((accs, 1, threads), n)
        last[0, 0, :tail] = head + vectors * accs + torch.arange(tail)
        parts.append(last)
    return torch.cat(parts, dim=1)  # (accs, steps, threads); an aligned row's has no empty head or tail step


class Numerics:
    """The rounding context a twin computes under: noise mode, replay count, generator.

    With `replays == R > 0` the twin's inputs carry a leading replay dim of size R and every random
    choice is drawn independently per element, so the R replays run as one batched computation.
    They are replays first_replay .. first_replay + R - 1 of the run seeded `seed`: each draws from
    its own generator (`draws`), so a run split into batches gives the replays of one unbatched run.
    `gen` is the shared generator: choices made once per call for every replay (a reduction's lane
    count under "order") and every draw of a context without replays.
    """

    def __init__(self, noise: str = "none", replays: int = 0, seed: int = 0, ftz: bool = False,
                 mca_precision: int | None = None, device: torch.device | str = "cpu", first_replay: int = 0):
        if noise not in NOISE_MODES:
            raise ValueError(f"unknown noise mode {noise!r}; expected one of {', '.join(NOISE_MODES)}")
        self.noise = noise
        self.replays = replays
        self.seed = seed
        self.ftz = ftz
        self.mca_precision = mca_precision
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self.first_replay = first_replay
        self._device = device
        self._draws: ReplayDraws | None = None

    @property
    def draws(self) -> torch.Generator | ReplayDraws:
        """Where element-wise draws come from: one generator per replay (made on first use), or `gen`."""
        if not self.replays:
            return self.gen
        if self._draws is None:
            self._draws = ReplayDraws(self.seed, self.first_replay, self.replays, self.gen, self._device)
        return self._draws

    def uniform(self, x: torch.Tensor) -> torch.Tensor:
        """U[0, 1) float64 shaped like x, drawn per replay where x carries the replay dim."""
        return _uniform(self.draws, tuple(x.shape), x.device)

    @property
    def deterministic(self) -> bool:
        return self.noise in ("none", "order")

    # -- rounding ---------------------------------------------------------------------------
    def round(self, x: torch.Tensor, f: Format | str) -> torch.Tensor:
        """Round a float64 result of one operation into format f, under this context's noise."""
        f = fmt(f)
        if self.noise == "stochastic":
            return round_stochastic(x, f, self.draws, self.ftz)
        if self.noise == "mca":
            t = f.p if self.mca_precision is None else self.mca_precision
            return round_nearest(perturb_mca(x, f, self.draws, t), f, self.ftz)
        if f.torch_dtype is not None and f.name in ("float32", "float16", "bfloat16") and not self.ftz:
            # Fast path, bit-identical to round_nearest for values already representable in float32
            # (every twin intermediate): the hardware cast is correctly rounded from float32.
            return _cast_via_float32(x, f)
        return round_nearest(x, f, self.ftz)

    # -- reductions -------------------------------------------------------------------------
    def sum(self, x: torch.Tensor, dim: int = -1, acc: Format | str = "float32", order: str = "blocked",
            lanes: int = 256, keepdim: bool = False, outputs: int = 1, itemsize: int = 4) -> torch.Tensor:
        """Sum along `dim` accumulating in format `acc`, rounding after every addition.

        order:
        - "sequential": s = ((x0 + x1) + x2) + ... (a CPU loop, one thread per row);
        - "pairwise":   a balanced tree (Triton's tl.sum, a warp shuffle reduction);
        - "blocked":    each of `lanes` threads sums its strided elements i, i+lanes, ... in
                        sequence, then a tree over the lanes (a GPU block reduction; with lanes = K
                        chunks it is a split-K reduction);
        - "cuda":       torch's CUDA reduce kernel over the last dim (`_cuda_reduce`), whose block
                        width depends on how many sums the call makes (`outputs`: the rows), and whose
                        vector loads on the GPU tensor's element size (`itemsize` bytes).
        Under noise "order" the elements are permuted at random (per replay and row) and the lane
        count is drawn from {32, 64, ..., 1024}.
        """
        acc = fmt(acc)
        if order == "cuda" and dim not in (-1, x.ndim - 1):  # torch sets a strided reduction up otherwise
            raise ValueError(f"order 'cuda' models a reduction over the last dim, not dim {dim}")
        x = x.movedim(dim, -1)
        n = x.shape[-1]
        if self.noise == "order" and n > 1:
            perm = torch.argsort(self.uniform(x), dim=-1)
            x = torch.gather(x, -1, perm)
            lanes = 2 ** int(torch.randint(5, 11, (1,), generator=self.gen))  # one for every replay
            order = "blocked"
        x, add = self.terms(x, acc)
        if order == "sequential":
            out = self._sequential(x, add)
        elif order == "pairwise":
            out = self._tree(x, add)
        elif order == "blocked":
            out = self._blocked(x, add, lanes)
        elif order == "cuda":
            out = self._cuda_reduce(x, add, outputs, itemsize)
        else:
            raise ValueError(f"unknown reduction order {order!r}")
        out = out.to(torch.float64)
        return out.unsqueeze(dim) if keepdim else out

    def terms(self, x: torch.Tensor, acc: Format | str) -> tuple[torch.Tensor, Callable[..., torch.Tensor]]:
        """(x, add) for summing x's terms in `acc`: x cast to float32 and float32 tensor addition where that is
        the rounded addition (_adder) and every term is a float32 value (one kernel a step, the same bits), else x
        and the rounded addition."""
        acc = fmt(acc)
        add = self._adder(acc)
        if add is _add32:  # exact float32 arithmetic when every term is a float32 value
            x32 = x.to(torch.float32)
            # One fused comparison; NaN terms fail it and take the (equally exact) rounding path.
            if torch.equal(x32.to(torch.float64), x):
                return x32, add
            add = lambda s, t: self.round(s + t, acc)  # noqa: E731
        return x, add

    def _adder(self, acc: Format):
        """The rounded addition of two acc values: float32 tensor addition (IEEE, correctly rounded:
        bit-identical to round(s + t) and one kernel instead of three) where rounding is to nearest."""
        if acc.name == "float32" and not self.ftz and self.noise in ("none", "order"):
            return _add32
        return lambda s, t: self.round(s + t, acc)

    def mean(self, x: torch.Tensor, dim: int = -1, acc: Format | str = "float32", order: str = "cuda",
             lanes: int = 256, keepdim: bool = False, itemsize: int = 4) -> torch.Tensor:
        """CUDA's torch.mean over `dim`: the sum accumulated in `acc` (as `sum`), times the float32
        factor ~ 1/n, the product rounded in `acc` (MeanOps::project returns acc * factor, SharedReduceOps.h;
        the factor: cuda_mean_factor). It does not divide: fp32(s * fp32(1/n)) parts from fp32(s / n)
        for n not a power of two. CPU torch divides (sum, then div_), and so do our Triton kernels,
        whose twins round s / n themselves. The factor counts the means of one input: under replays
        x's leading dim is the replay dim, not part of it."""
        n = x.shape[dim]
        rows = self.rows(x, dim)
        s = self.sum(x, dim, acc, order, lanes, keepdim, outputs=rows, itemsize=itemsize)
        return self.round(s * cuda_mean_factor(rows, n), acc)

    def rows(self, x: torch.Tensor, dim: int = -1) -> int:
        """How many sums a reduction of one input over `dim` makes on the GPU: under replays x's leading dim
        is the replay dim, not part of the input."""
        return x.numel() // max(x.shape[dim], 1) // self._replay_lead(x)

    def _replay_lead(self, x: torch.Tensor) -> int:
        """x's leading replay dim's size (this context's replays), 1 when x has none."""
        return self.replays if self.replays and x.ndim > 1 and x.shape[0] == self.replays else 1

    def max(self, x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
        """Max is exact in every order; NaN propagates, as on the GPU (torch.amax propagates NaN)."""
        return torch.amax(x, dim=dim, keepdim=keepdim)

    def _sequential(self, x: torch.Tensor, add) -> torch.Tensor:
        s = x[..., 0]
        for i in range(1, x.shape[-1]):
            s = add(s, x[..., i])
        return s

    def _tree(self, x: torch.Tensor, add) -> torch.Tensor:
        # Pad to a power of two with zeros (x + 0 is exact) and add halves until one is left.
        n = x.shape[-1]
        width = 1 << max(0, (n - 1).bit_length())
        if width != n:
            x = torch.nn.functional.pad(x, (0, width - n))
        while x.shape[-1] > 1:
            half = x.shape[-1] // 2
            x = add(x[..., :half], x[..., half:])
        return x[..., 0]

    def _blocked(self, x: torch.Tensor, add, lanes: int) -> torch.Tensor:
        n = x.shape[-1]
        lanes = max(1, min(lanes, n))
        steps = -(-n // lanes)
        if steps * lanes != n:
            x = torch.nn.functional.pad(x, (0, steps * lanes - n))
        x = x.reshape(*x.shape[:-1], steps, lanes)  # (..., steps, lanes): lane l holds l, l+lanes, ...
        s = x[..., 0, :]
        for i in range(1, steps):
            s = add(s, x[..., i, :])
        return self._tree(s, add)

    def _cuda_reduce(self, x: torch.Tensor, add, outputs: int, itemsize: int = 4) -> torch.Tensor:
        """torch's CUDA reduce (Reduce.cuh) of contiguous rows over their last dim, `outputs` rows a launch, the
        input's elements `itemsize` bytes wide on the GPU.

        ReduceConfig::set_block_dimension gives each row `width` threads (a power of two: 32 once 16 or more rows
        share a block, up to 512 for one row). Rows of 128 elements and more are read as aligned 16-byte vectors of
        `vec` = 16 / itemsize elements (4 float32, 8 float16 / bfloat16), thread t's accumulator j summing element
        j of vectors t, t + T, ... in sequence; shorter rows element-wise with vt0 = 4 accumulators, accumulator j
        summing t + j T + 4 k T. A row that does not start on a 16-byte boundary (rows of n elements where vec does
        not divide n: row r starts at r n) has its first elements up to the boundary summed first, one by each of
        threads shift..vec-1 into accumulator 0, and the elements past its last whole vector last, thread t taking
        the t-th into accumulator 0 (input_vectorized_thread_reduce_impl). Rows long enough (values per thread, in
        elements, >= 16 x block height or >= 256) are split over the block's warps: T = width x height threads
        work on one row, t = lane + width x warp. Each thread adds its accumulators in order, then the block: over
        the lanes (block_x_reduce: shared memory halving while more than a warp is left, then the warp's
        shuffle-downs at offsets 16, 8, ..., 1, halving too), then over a split row's warps (block_y_reduce,
        shared memory, halving).
        Checked on an H100 (bench/twin_softmax_sums.py, bench/results/softmax_sums_gpu_h100_s49.npz): every row
        sum of float16 / bfloat16 / float32 rows at widths 64 to 8192 (130: unaligned rows) and 1 to 512 rows a
        launch, bit for bit; 100 elements are read element-wise, 128 as vectors (the source's dim0 > 128 would
        not); and layernorm's constant rows (bench/twin_constant_rows.py). Not modelled, "blocked" over 256 lanes
        stands in: rows that ReduceConfig also splits over blocks (values per thread still >= 256 after the warp
        split while the grid is small: a handful of rows of 131072 and more), summed through global memory.
        """
        n = x.shape[-1]
        vec = max(16 // itemsize, 1)
        vectorized = n >= 128
        dim0 = n // vec if vectorized else n
        dim0_pow2 = min(1 << (dim0.bit_length() - 1), 512)
        dim1_pow2 = min(1 << (max(outputs, 1).bit_length() - 1), 512)
        width = min(dim0_pow2, 32)
        height = min(dim1_pow2, 512 // width)
        width = min(dim0_pow2, 512 // height)
        per_thread = -(-n // width)  # values_per_thread counts elements, vectorized or not
        split = per_thread >= 16 * height or per_thread >= 256  # over the block's warps (one row: height 1)
        threads = width * height if split else width
        if split and -(-n // threads) >= 256 and outputs <= _CUDA_GRID_TARGET:
            return self._blocked(x, add, 256)  # split over blocks too: a global-memory reduction, not modelled
        lead = x.shape[:-1]
        # (replays or 1, rows, n): a leading replay dim stays leading, so each replay draws its own noise
        x = x.reshape(self._replay_lead(x), -1, n)
        # each row's 16-byte misalignment, in elements: row r of an input starts at element r n
        shift = torch.arange(x.shape[1]) * n % vec if vectorized else torch.zeros(x.shape[1], dtype=torch.long)
        out = torch.empty(x.shape[:2], dtype=x.dtype)
        x = torch.nn.functional.pad(x, (0, 1))  # element n is the zero pad (x + 0 is exact)
        for sh in shift.unique().tolist():  # one order per misalignment: at most vec of them
            pick = (shift == sh).nonzero().squeeze(-1)
            rows = x if len(pick) == x.shape[1] else x[:, pick]
            index = _cuda_reduce_index(n, threads, vec if vectorized else 4, vectorized, sh)  # (accs, steps, threads)
            terms = rows[..., index]
            acc = add(torch.zeros_like(terms[..., 0, :]), terms[..., 0, :])  # from +0, as torch's: -0 + 0 = +0
            for k in range(1, terms.shape[-2]):
                acc = add(acc, terms[..., k, :])
            s = acc[..., 0, :]  # (replays, rows, threads)
            for j in range(1, acc.shape[-2]):
                s = add(s, acc[..., j, :])
            s = s.reshape(*s.shape[:-1], threads // width, width)  # (..., warps, lanes): t = lane + width x warp
            s = self._tree(s, add)  # block_x_reduce over the lanes: shared memory, then the warp's shuffles, both halve
            out[:, pick] = self._tree(s, add).to(out.dtype)  # block_y_reduce over a split row's warps, halving
        return out.reshape(lead)

    # -- products -----------------------------------------------------------------------------
    def matmul(self, a: torch.Tensor, b: torch.Tensor, out: Format | str, acc: Format | str = "float32",
               chunk: int = 32) -> torch.Tensor:
        """a @ b with exact products, chunks of `chunk` along k summed exactly (a tensor-core MMA
        accumulates a k-tile internally), the chunk partials accumulated in sequence in `acc`, then
        the output rounded to `out` (kept as is when `out` is `acc`). Batched over leading dims; a leading replay dim on either side
        broadcasts. Under noise "order" the chunk width is drawn from {16, 32, 64} (one per call) and
        every replay accumulates the partials in its own random order.

        Cost: an input that is a replay-expanded view (stride 0, from `expand`) is multiplied once,
        not R times; under stochastic/mca the partials are formed and rounded chunk by chunk so the
        replay dim never multiplies the memory of all partials.
        """
        acc, out = fmt(acc), fmt(out)
        a, a_shared = self._unreplay(a)
        b, b_shared = self._unreplay(b)
        shared = bool(self.replays) and a_shared and b_shared  # the result gets the replay dim back
        k = a.shape[-1]
        if self.noise == "order":
            chunk = int((16, 32, 64)[int(torch.randint(0, 3, (1,), generator=self.gen))])
        chunk = max(1, min(chunk, k))
        starts = range(0, k, chunk)  # the last chunk may be shorter (zero padding would be exact)

        def partial(lo: int) -> torch.Tensor:  # (..., m, n) the chunk's exact sum of products
            return a[..., lo:lo + chunk] @ b[..., lo:lo + chunk, :]

        if self.noise == "order":
            s = self._accumulate_rne(torch.stack([self.round(partial(lo), acc) for lo in starts], dim=-3), acc, shared)
        else:
            # One chunk at a time: each product is a plain GEMM (much faster on the CPU than one
            # batched small-k product) and the partials never all sit in memory at once.
            add = self._adder(acc)
            s = None
            for lo in starts:
                p = partial(lo)
                if shared and not self.deterministic:
                    p = self.expand(p)  # (R, ..., m, n): each replay rounds on its own
                if add is _add32:  # round to nearest fp32 is the hardware cast; fp32 adds are exact IEEE
                    p = p.to(torch.float32)
                    s = p if s is None else s.add_(p)
                else:
                    p = self.round(p, acc)
                    s = p if s is None else add(s, p)
            s = s.to(torch.float64)
        if shared and s.ndim == max(a.ndim, b.ndim):  # deterministic "none": replays are all alike
            s = self.expand(s)
        # Storing the accumulator in its own format is no operation: nothing to round (or perturb).
        return s if out == acc else self.round(s, out)

    def _unreplay(self, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Drop a leading replay dim that is a broadcast view (stride 0), so it is computed once."""
        if self.replays and x.ndim >= 3 and x.shape[0] == self.replays and x.stride(0) == 0:
            return x[0], True
        return x, False

    def _accumulate_rne(self, partials: torch.Tensor, acc: Format, shared: bool) -> torch.Tensor:
        """Sum partials (..., C, m, n) over C in sequence with round-to-nearest in `acc`; under
        "order" each replay takes its own random permutation of the C partials."""
        n_chunks = partials.shape[-3]
        if self.noise == "order" and n_chunks > 1:
            if self.replays:
                perm = torch.argsort(_uniform(self.draws, (self.replays, n_chunks), partials.device), dim=-1)  # (R, C)
                if shared:  # partials carry no replay dim: gather each step's partial per replay
                    steps = [partials.index_select(-3, perm[:, i]).movedim(-3, 0) for i in range(n_chunks)]
                    return self._add_in_sequence(steps, acc)
                idx = perm.reshape(self.replays, *([1] * (partials.ndim - 4)), n_chunks, 1, 1)
                partials = torch.take_along_dim(partials, idx, dim=-3)
            else:
                partials = partials.index_select(-3, torch.randperm(n_chunks, generator=self.gen))
        return self._add_in_sequence([partials[..., i, :, :] for i in range(n_chunks)], acc)

    def _add_in_sequence(self, terms: list[torch.Tensor], acc: Format) -> torch.Tensor:
        """((t0 + t1) + t2) + ..., each addition rounded to nearest in acc. float32 terms add as
        float32 tensors: IEEE addition of two float32 values is the correctly rounded exact sum,
        bit-identical to round(t + t', float32) and one kernel instead of three."""
        add = self._adder(acc)
        s = terms[0].to(torch.float32) if add is _add32 else terms[0]
        for t in terms[1:]:
            s = add(s, t.to(s.dtype))
        return s.to(torch.float64)

    def align(self, w: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """View a trailing-dims parameter (e.g. weight (R, hidden)) so it broadcasts against `like`
        (R, ..., hidden) when both carry the replay dim; without replays broadcasting is already right."""
        if not self.replays or w.ndim >= like.ndim:
            return w
        return w.reshape(w.shape[0], *([1] * (like.ndim - w.ndim)), *w.shape[1:])

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """Give an input the leading replay dim (a view) when this context has replays."""
        return x.unsqueeze(0).expand(self.replays, *x.shape) if self.replays else x


def _add32(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return s + t


def _cast_via_float32(x: torch.Tensor, f: Format) -> torch.Tensor:
    """Hardware casts: float64 -> float32 is correctly rounded; float32 -> half/bfloat16 too."""
    y = x.to(torch.float32)
    if f.torch_dtype is not torch.float32:
        y = y.to(f.torch_dtype)
    return y.to(torch.float64)


def ulps_between(a: torch.Tensor, b: torch.Tensor, f: Format | str) -> torch.Tensor:
    """|a - b| in ulps of format f at the magnitude of b (inf where exactly one is non-finite)."""
    f = fmt(f)
    d = (a - b).abs() / f.ulp(b)
    both_same_nonfinite = (~torch.isfinite(a)) & (~torch.isfinite(b)) & ((a == b) | (torch.isnan(a) & torch.isnan(b)))
    return torch.where(both_same_nonfinite, torch.zeros_like(d), torch.nan_to_num(d, nan=math.inf))
