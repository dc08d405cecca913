"""The stream forecaster: is a stream of calls drifting into a fault region, and how soon?

    python -c "from optwin.fingerprints import Matcher; s = Matcher.open('fp.duckdb').stream('l3.norm', 'rmsnorm', 'native-dtype', 'float16'); print(s.observe(sketch={...}, t=0.0))"

A stream is one call site (a layer's norm, an attention block) observed over time. Per stream:
1. Each observation's fault-driving features (catalog `region_features`) are put on the region grid's
   own log scale (`matcher.continuous_bin`: bins are log2 steps of the value). The last `window`
   observations (kept at least `min_spacing_s` apart) are the trend's window.
2. Is there a trend? Per feature, a Mann-Kendall test over every pair of the window (rank based, so
   the same on either scale; tie corrected; S kept up to date call by call): a feature moves only when
   |z| >= `trend_z`. z = 4 is a two-sided p of ~6e-5 per refit: flat lognormal noise (sigma 0.2-0.4,
   20 calls/s) gave no warning in 4 stream-hours per sigma, where the earlier sign test on window/2
   lagged slopes (80 % agreement) let ~7 % of pure-noise refits through (5-19 warnings in 5 minutes).
   A 32-point window at 0.25 s spans ~8 s: long enough to see a drift under noise and its curvature.
3. Which growth? Two models, each a Theil-Sen line (median of the pair slopes at least half a window
   apart: outliers ignored): exponential (a line on the log-bin scale: activations blowing up) and
   additive (a line in the feature's own value: decode positions, counters). Both are scored by their
   median absolute residual on the bin scale; the additive one is used when its residual is at most
   `additive_ratio` of the exponential one's, so a stream whose curvature the window cannot show keeps
   the exponential (earlier) forecast. Extrapolating everything on the log scale read a position rising
   0 -> 48 at 20/s as doubling every few seconds (a fault 5 hours away forecast 10 s away).
4. Forecast: follow each moving feature along its model from the trend line's value now, from one
   bin boundary to the next (exact crossing times, merged over features), up to `lookahead_s`, and
   look each region up in the fingerprints (unreplayed regions by the matcher's conservative rule).
   `eta_s` is the time to the first region whose fault probability reaches the matcher's threshold;
   0 when the current call is already there. Uncertainty: eta_low_s / eta_high_s rescale eta by the
   interquartile pair slopes of the fastest feature (a fast/slow arrival band). The trend is refitted
   when the window takes a point (at most once per min_spacing_s); between refits eta counts down.
5. Verdict with hysteresis: a stream enters the warning state when the call's probability reaches
   the threshold or eta_s <= horizon_s; it leaves only after `exit_calls` consecutive calls below
   `exit_ratio * threshold` with no forecast within `exit_horizon_ratio * horizon_s`. No flapping, and a
   stationary safe stream never warns. `raised` marks the call that opened a warning episode.

Time: `t` must grow per producer, but a stream may be fed by several (replicas on one sidecar, each
posting batches), so calls arrive slightly out of order. A call up to `reorder_s` older than the
newest one seen joins the window in time order (kept only if `min_spacing_s` from its neighbours);
only a larger backwards step (a restarted producer's clock) starts a new history. Producers whose clocks
differ by more than `reorder_s` (time.monotonic() on several hosts) keep a history each: the one left by
a jump is parked (up to `clocks` per stream, ~5 KB each, with its fit), and a later call within `reorder_s`
of a parked history's newest call (either side: a host's replicas interleave), when the current one does not
take it, goes on in that history. A parked history not taken up again within `clock_ttl_calls` calls is
dropped, so a single producer's restart clears its history as before (the one difference: a pause that takes
the restarted clock to within `reorder_s` of where the earlier clock stopped, within those calls); `clocks=1`
is the old behaviour exactly. Before,
each alternation between such producers cleared the only history: no forecast ever.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optwin.errors import CatalogError, InputError
from optwin.fingerprints.matcher import KNOWN_RULES, Matcher, Risk, call_sketch, continuous_bin_of
from optwin.fingerprints.sampling import Sampler, SamplingConfig


@dataclass(frozen=True)
class ForecastConfig:
    window: int = 32  # observations the trend is fitted on ...
    min_spacing_s: float = 0.25  # ... at least this far apart (a 1 kHz stream still spans seconds)
    min_points: int = 10  # no trend before this many observations (fewer: start-up transients)
    trend_z: float = 4.0  # Mann-Kendall |z| a feature's trend must reach (4.0: two-sided p ~6e-5 a refit)
    additive_ratio: float = 0.5  # additive model when its bin-scale residuals are <= this x the exponential's
    reorder_s: float = 10.0  # calls up to this much older than the newest join in order; older: a restart
    clocks: int = 4  # histories a stream keeps for producers with clocks further apart than reorder_s
    clock_ttl_calls: int = 256  # a parked history not taken up again within this many calls is dropped
    horizon_s: float = 30.0  # warn when a fault region is forecast within this many seconds
    lookahead_s: float = 300.0  # how far along the drift line eta is searched (eta None beyond)
    max_steps: int = 512  # cap on bin crossings per search
    exit_ratio: float = 0.5  # leave the warning state below exit_ratio * threshold ...
    exit_calls: int = 5  # ... for this many consecutive calls ...
    exit_horizon_ratio: float = 1.5  # ... with no forecast within exit_horizon_ratio * horizon_s

    @staticmethod
    def preset(name: str) -> "ForecastConfig":
        """'default'; 'eager' (short window, long horizon: demos); 'steady' (long window, fewer alarms)."""
        presets = {
            "default": ForecastConfig(),
            "eager": ForecastConfig(window=16, min_points=8, trend_z=3.0, horizon_s=60.0),
            "steady": ForecastConfig(window=48, min_points=12, trend_z=4.5, horizon_s=15.0, exit_calls=20),
        }
        try:
            return presets[name]
        except KeyError:
            raise CatalogError(f"unknown forecast preset {name!r}; expected one of {', '.join(presets)}") from None


@dataclass(slots=True)
class StreamRisk:
    """The verdict for one call of a stream."""

    stream: str
    warn: bool  # the stream is in its warning state (hysteresis applied)
    probability: dict[str, float]  # this call's probabilities per fault type
    known: bool
    eta_s: float | None  # forecast seconds until the stream reaches a fault region (0: there now)
    forecast_warn: bool  # eta_s within the horizon
    raised: bool  # this call opened a new warning episode
    t: float
    region: tuple[int, ...] = ()
    eta_low_s: float | None = None
    eta_high_s: float | None = None
    velocity: tuple[float, ...] = ()  # bins per second per region feature

    @property
    def max_probability(self) -> float:
        return max(self.probability.values()) if self.probability else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The sidecar's answer record."""
        return {"stream": self.stream, "warn": self.warn, "probability": self.probability, "known": self.known,
                "eta_s": self.eta_s}


class Stream:
    """Per-call risk plus the drift forecast of one call site. Not thread-safe (one per site)."""

    def __init__(self, matcher: Matcher, name: str, op: str, variant: str, dtype: str,
                 config: ForecastConfig | None = None, sampling: SamplingConfig | Sampler | None = None) -> None:
        self.name, self.op, self.variant, self.dtype = name, op, variant, dtype
        self.cfg = config or ForecastConfig()
        self.sampler = sampling if isinstance(sampling, Sampler) else Sampler(sampling)
        self._ts: list[float] = []  # the trend's window, in time order
        self._cols: list[list[float]] = []  # per region feature, its bin coordinates over the window
        self._s: list[int] | None = []  # Mann-Kendall S per feature (None: to recount)
        self._t_new = -math.inf  # the newest call time seen (calls of several producers interleave)
        # Histories of other clocks, most recently left first: [t_new, ts, cols, s, n_observed when left, its fit and
        # window generation (kept with it: producers alternating call by call would otherwise refit every call)].
        self._parked: list[list[Any]] = []
        self.warning = False
        self._calm = 0
        self.n_observed = 0
        self.n_episodes = 0
        self.last: StreamRisk | None = None
        self._fc: tuple[float, float | None, float | None, float | None, tuple[float, ...], int] | None = None
        self._gen = 0  # bumped when the window changes: the trend is refitted then, and only then
        self.rebind(matcher)

    def rebind(self, matcher: Matcher) -> None:
        """Follow a reloaded database; the stream's history is kept."""
        self._m = matcher
        self._ti = matcher.triple_index(self.op, self.variant, self.dtype)

    def should_check(self) -> bool:
        """Dynamic sampling: whether the next call should be sketched and observed."""
        return self.sampler.should_check()

    def observe(self, inputs: Mapping[str, Any] | None = None, params: Mapping[str, Any] | None = None,
                sketch: Mapping[str, Any] | None = None, t: float | None = None) -> StreamRisk:
        """Observe one call (tensors or a sketch) at time t (seconds, monotonic; now by default)."""
        sk = call_sketch(self.op, self.dtype, inputs, params, sketch, "observe")
        if t is None:
            t = time.monotonic()
        elif type(t) is not float or not -math.inf < t < math.inf:  # the common case costs two compares
            t = _seconds(t)
        return self.observe_valid(sk, t)

    def observe_valid(self, sk: dict[str, float], t: float) -> StreamRisk:
        """observe for a validated sketch: the hot path."""
        ti, m = self._ti, self._m
        thr = m.config.threshold
        coords = ti.coordinates(sk)
        region = tuple([int(c) for c in coords])  # int() truncates toward 0: the signed floor of |c|
        probs, rule = ti.answer(region, sk, m.config)
        p = max(probs, default=0.0)
        self._remember(t, coords)
        self.n_observed += 1
        eta = lo = hi = None
        vel: tuple[float, ...] = ()
        if p >= thr:
            eta = lo = hi = 0.0
            self._fc = None
        elif len(self._ts) >= self.cfg.min_points:
            fc = self._fc
            if fc is None or fc[5] != self._gen:  # a new point in the window: refit (once per min_spacing_s)
                eta, lo, hi, vel = self._forecast(thr)
                fc = self._fc = (self._ts[-1], eta, lo, hi, vel, self._gen)
            # the fit's etas are from its newest point; calls since count down (a refit ~0.1-0.5 ms, a call ~10 us)
            dt = self._t_new - fc[0]
            eta, lo, hi = (None if v is None else max(0.0, v - dt) for v in fc[1:4])
            vel = fc[4]
        fwarn = eta is not None and eta <= self.cfg.horizon_s
        raised = False
        if not self.warning:
            if p >= thr or fwarn:
                self.warning, raised, self._calm = True, True, 0
                self.n_episodes += 1
        elif p < thr * self.cfg.exit_ratio and (eta is None or eta > self.cfg.horizon_s * self.cfg.exit_horizon_ratio):
            self._calm += 1
            if self._calm >= self.cfg.exit_calls:
                self.warning, self._calm = False, 0
        else:
            self._calm = 0
        self.sampler.record(self.warning)
        r = StreamRisk(self.name, self.warning, dict(zip(ti.fault_types, probs)), rule in KNOWN_RULES, eta, fwarn,
                       raised, t, region, lo, hi, vel)
        self.last = r
        return r

    def _remember(self, t: float, coords: tuple[float, ...]) -> None:
        """Put a call into the trend's window: in time order, at least min_spacing_s from its neighbours.

        Several producers (replicas posting batches to one sidecar) interleave, so a call a little older
        than the newest is normal: it is slotted in where it belongs, not read as a restart. Only a step
        back of more than reorder_s (a restarted producer's clock) clears the history."""
        ts, cols, gap = self._ts, self._cols, self.cfg.min_spacing_s
        if len(cols) != len(coords):  # the first call
            cols[:] = [[] for _ in coords]
            self._s = [0] * len(coords)
        if t >= self._t_new:
            if self._parked and t > self._t_new + self.cfg.reorder_s and self._switch_clock(t):
                return self._remember(t, coords)
            self._t_new = t
            if ts and t - ts[-1] < gap:
                return
            ts.append(t)
            s = self._s
            for i, (col, x) in enumerate(zip(cols, coords)):
                if s is not None:  # Mann-Kendall S kept up to date: the new point against every earlier one
                    s[i] += 2 * sum(map(x.__gt__, col)) - len(col) + col.count(x)  # (above) - (below)
                col.append(x)
        elif t < self._t_new - self.cfg.reorder_s:
            if self._switch_clock(t):
                return self._remember(t, coords)
            # a clock not seen before (another host) or a restarted one: a new history, the current one parked
            self._park()
            ts, cols = self._ts, self._cols = [t], [[] for _ in coords]
            for col, x in zip(cols, coords):
                col[:] = [x]
            self._t_new, self._fc, self._s = t, None, [0] * len(coords)
        else:
            j = bisect.bisect_right(ts, t)
            if (j == 0 and len(ts) >= self.cfg.window) or (j > 0 and t - ts[j - 1] < gap) or \
                    (j < len(ts) and ts[j] - t < gap):
                return
            ts.insert(j, t)
            for col, x in zip(cols, coords):
                col.insert(j, x)
            self._s = None  # rare: recounted at the next fit
        if len(ts) > self.cfg.window:
            del ts[0]
            s = self._s
            for i, col in enumerate(cols):
                x = col.pop(0)
                if s is not None:
                    s[i] -= 2 * sum(map(x.__lt__, col)) - len(col) + col.count(x)
        self._gen += 1

    def _park(self) -> None:
        """Keep the current history aside (another producer's clock may come back to it)."""
        if self.cfg.clocks > 1:
            self._parked.insert(0, [self._t_new, self._ts, self._cols, self._s, self.n_observed, self._fc, self._gen])
            del self._parked[self.cfg.clocks - 1:]

    def _switch_clock(self, t: float) -> bool:
        """Go on in the parked history whose clock t continues (its newest call within reorder_s of t, either
        side: replicas sharing a host's clock post interleaved, slightly out of order; the latest if several),
        when the current history does not take t (more than reorder_s away). False (nothing changed) when none
        does: a restart or a new clock. A producer restarted with its clock from 0 still starts a new history
        unless an earlier clock stopped within reorder_s of 0."""
        oldest, r = self.n_observed - self.cfg.clock_ttl_calls, self.cfg.reorder_s
        parked = self._parked = [p for p in self._parked if p[4] >= oldest]
        best = None
        for p in parked:
            if abs(t - p[0]) <= r and (best is None or p[0] > best[0]):
                best = p
        if best is None:
            return False
        parked.remove(best)
        self._park()
        self._t_new, self._ts, self._cols, self._s = best[:4]
        self._fc, self._gen = best[5], best[6]  # its own fit, valid while its window has not changed
        return True

    # ------------------------------------------------------------------ trend and search

    def _trend(self) -> tuple[tuple[float, ...], list[_Drift | None]]:
        """(level now on the bin scale, the drift of each feature or None where it has no trend)."""
        ts, cols = self._ts, self._cols
        n = len(ts)
        t_now = ts[-1]
        zmin, ratio = self.cfg.trend_z, self.cfg.additive_ratio
        var_n = n * (n - 1) * (2 * n + 5) / 18.0
        if self._s is None:
            self._s = [_kendall_s(col) for col in cols]
        level = [col[-1] for col in cols]
        drifts: list[_Drift | None] = []
        h = max(1, n // 2)
        for i, (_, scale, res) in enumerate(self._ti.grid):
            cv, s = cols[i], self._s[i]
            # Mann-Kendall: S (rising minus falling pairs) against its spread in a trendless window. Ties
            # (integer features repeat) only shrink the variance, so it is corrected only when that matters.
            var = var_n
            if (abs(s) - 1) < zmin * math.sqrt(var):
                if len(set(cv)) < n:
                    var -= _tie_term(cv)
                if s == 0 or var <= 0.0 or (abs(s) - 1) < zmin * math.sqrt(var):
                    drifts.append(None)
                    continue
            xv = [_value(c, scale, res) for c in cv]
            # Theil-Sen slopes on the pairs at least half a window apart (~n^2/8 of them: the informative
            # ones; close pairs mostly measure noise), in both scales.
            se, sa = [], []
            for lag in range(h, n):
                dts = [b - a for a, b in zip(ts, ts[lag:])]
                se += [(b - a) / d for a, b, d in zip(cv, cv[lag:], dts)]
                sa += [(b - a) / d for a, b, d in zip(xv, xv[lag:], dts)]
            se.sort()
            sa.sort()
            me, ma = _median(se), _median(sa)
            ce = _median(sorted([c + me * (t_now - tj) for c, tj in zip(cv, ts)]))
            xa = _median(sorted([x + ma * (t_now - tj) for x, tj in zip(xv, ts)]))
            # Which growth: each model's median absolute residual on the bin scale (where noise is
            # multiplicative); a median, as a request's restart (a window's one point far off) must not decide.
            re = _median(sorted([abs(c - ce - me * (tj - t_now)) for c, tj in zip(cv, ts)]))
            ra = _median(sorted([abs(c - continuous_bin_of(xa + ma * (tj - t_now), scale, res)) for c, tj in zip(cv, ts)]))
            if ra <= ratio * re:
                if ma == 0.0:
                    drifts.append(None)
                    continue
                c0 = continuous_bin_of(xa, scale, res)
                d = _Drift(True, xa, ma, res * ma / (_LN2 * (scale + abs(xa))), sa[len(sa) // 4],
                           sa[(3 * len(sa)) // 4], scale, res)
            else:
                if me == 0.0:
                    drifts.append(None)
                    continue
                c0 = ce
                d = _Drift(False, ce, me, me, se[len(se) // 4], se[(3 * len(se)) // 4], scale, res)
            level[i] = c0
            drifts.append(d)
        return tuple(level), drifts

    def _forecast(self, thr: float) -> tuple[float | None, float | None, float | None, tuple[float, ...]]:
        level, drifts = self._trend()
        vel = tuple(0.0 if d is None else d.vbin for d in drifts)
        moving = [i for i, d in enumerate(drifts) if d is not None]
        if not moving:
            return None, None, None, vel
        ti, m = self._ti, self._m
        region = [int(c) for c in level]
        last = tuple(region)
        eta = None
        if m.max_probability_at(ti, last) >= thr:  # the trend line is there now (this call's noise is below)
            eta = 0.0
        # Walk from bin boundary to bin boundary: each feature's crossing times are exact on its model,
        # merged in time order, so a slow feature and a fast one both land in every cell they pass.
        heap: list[tuple[float, int, int]] = []
        for i in moving:
            d = drifts[i]
            step = 1 if d.slope > 0 else -1
            k = math.floor(level[i]) + 1 if step > 0 else math.ceil(level[i]) - 1
            _push(heap, d, i, k if k else step)
        lookahead, steps = self.cfg.lookahead_s, 0
        while eta is None and heap and steps < self.cfg.max_steps:
            tau = heap[0][0]
            if tau > lookahead:
                break
            tau_in = tau * (1.0 + 1e-9) + 1e-12  # just past the boundary
            while heap and heap[0][0] <= tau_in:
                _, i, k = heapq.heappop(heap)
                d = drifts[i]
                region[i] = int(d.coord_at(tau_in))
                step = 1 if d.slope > 0 else -1
                _push(heap, d, i, k + step if k + step else k + 2 * step)
            steps += 1
            reg = tuple(region)
            if reg == last:
                continue
            last = reg
            if m.max_probability_at(ti, reg) >= thr:
                eta = tau
        if eta is None:
            return None, None, None, vel
        fast = max(moving, key=lambda i: abs(drifts[i].vbin))
        d = drifts[fast]
        med = d.slope
        fast_s, slow_s = (d.q75, d.q25) if med > 0 else (d.q25, d.q75)
        lo = eta * abs(med) / abs(fast_s) if fast_s * med > 0 else eta
        hi = eta * abs(med) / abs(slow_s) if slow_s * med > 0 else None
        return eta, min(lo, eta), (max(hi, eta) if hi is not None else None), vel


_LN2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class _Drift:
    """One feature's trend: a Theil-Sen line in the feature's value (additive) or on its bin scale."""

    additive: bool
    x0: float  # the line's value now (value or bin coordinate)
    slope: float  # per second, on the same scale
    vbin: float  # bins per second now
    q25: float  # interquartile pair slopes (the eta band)
    q75: float
    scale: float
    res: float

    def coord_at(self, tau: float) -> float:
        x = self.x0 + self.slope * tau
        return continuous_bin_of(x, self.scale, self.res) if self.additive else x

    def crossing(self, k: int) -> float:
        """Seconds from now until the line reaches bin boundary k (inf past the float range)."""
        if self.additive:
            if abs(k) / self.res > 1000.0:  # 2**1024 overflows; no sketch value gets there (FEATURE_CAP)
                return math.inf
            return (_value(k, self.scale, self.res) - self.x0) / self.slope
        return (k - self.x0) / self.slope


def _push(heap: list[tuple[float, int, int]], d: _Drift, i: int, k: int) -> None:
    tau = d.crossing(k)
    if tau < math.inf:
        heapq.heappush(heap, (max(tau, 0.0), i, k))


def _value(c: float, scale: float, res: float) -> float:
    """The inverse of matcher.continuous_bin_of: a bin coordinate back to the feature's value."""
    v = scale * (2.0 ** (min(abs(c) / res, 1000.0)) - 1.0)
    return -v if c < 0 else v


def _kendall_s(col: list[float]) -> int:
    """Mann-Kendall S of a series in time order: pairs that rise minus pairs that fall."""
    s = 0
    for j in range(len(col) - 1):
        x, rest = col[j], col[j + 1:]
        s += sum(map(x.__lt__, rest)) - sum(map(x.__gt__, rest))
    return s


def _tie_term(col: list[float]) -> float:
    """What tied values take off S's variance: sum of t(t-1)(2t+5)/18 over groups of t equal values."""
    out, run, srt = 0.0, 1, sorted(col)
    for a, b in zip(srt, srt[1:] + [math.nan]):
        if a == b:
            run += 1
        else:
            out += run * (run - 1) * (2 * run + 5) / 18.0
            run = 1
    return out


def _median(srt: list[float]) -> float:
    k = len(srt)
    return srt[k // 2] if k % 2 else 0.5 * (srt[k // 2 - 1] + srt[k // 2])


def _seconds(t: Any) -> float:
    """A call's time as float seconds; a NaN would never compare as later and stop the history for good."""
    try:
        v = float(t)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"observe: t must be a finite number of seconds, got {type(t).__name__} {t!r:.40}") from None
    if isinstance(t, bool) or not math.isfinite(v):
        raise InputError(f"observe: t must be a finite number of seconds, got {t!r:.40}")
    return v


__all__ = ["ForecastConfig", "Stream", "StreamRisk", "Risk"]
