"""The stream forecaster: is a stream of calls drifting into a fault region, and how soon?

    python -c "from optwin.fingerprints import Matcher; s = Matcher.open('fp.duckdb').stream('l3.norm', 'rmsnorm', 'native-dtype', 'float16'); print(s.observe(sketch={...}, t=0.0))"

A stream is one call site (a layer's norm, an attention block) observed over time. Per stream:
1. Each observation's fault-driving features (catalog `region_features`) are put on the region grid's
   own log scale (`matcher.continuous_bin`: bins are log2 steps, so a trend is "bins per second"
   and exponential growth of activations is a straight line).
2. Trend over the last `window` observations (kept at least `min_spacing_s` apart), per feature: a Theil-Sen-style estimator on lagged
   pairs (slopes between observation j and j + window/2, their median). It ignores outliers and
   costs window/2 slopes per feature. A trend counts only when at least `sign_agreement` of those
   slopes agree in sign (a sign test): a stationary noisy stream has no trend.
3. Forecast: walk the drift line from the current level (the trend line's value now) in
   quarter-bin steps, up to `lookahead_s`, and look each region up in the fingerprints (unreplayed
   regions by the matcher's conservative rule). `eta_s` is the time to the first region whose fault
   probability reaches the matcher's threshold; 0 when the current call is already there.
   Uncertainty: eta_low_s / eta_high_s rescale eta by the interquartile pair slopes of the fastest
   feature (a fast/slow arrival band).
4. Verdict with hysteresis: a stream enters the warning state when the call's probability reaches
   the threshold or eta_s <= horizon_s; it leaves only after `exit_calls` consecutive calls below
   `exit_ratio * threshold` with no forecast within `exit_horizon_ratio * horizon_s`. No flapping, and a stationary safe
   stream never warns. `raised` marks the call that opened a warning episode.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optwin.errors import CatalogError, InputError
from optwin.fingerprints.matcher import KNOWN_RULES, Matcher, Risk, call_sketch
from optwin.fingerprints.sampling import Sampler, SamplingConfig


@dataclass(frozen=True)
class ForecastConfig:
    window: int = 16  # observations the trend is fitted on ...
    min_spacing_s: float = 0.25  # ... at least this far apart (a 1 kHz stream still spans seconds)
    min_points: int = 10  # no trend before this many observations (fewer: start-up transients)
    sign_agreement: float = 0.8  # fraction of lagged-pair slopes that must share a sign
    horizon_s: float = 30.0  # warn when a fault region is forecast within this many seconds
    lookahead_s: float = 300.0  # how far along the drift line eta is searched (eta None beyond)
    max_steps: int = 512  # cap on quarter-bin steps per search
    refresh_calls: int = 8  # refit the trend every this many calls ...
    refresh_s: float = 1.0  # ... or this many stream seconds; in between eta counts down
    exit_ratio: float = 0.5  # leave the warning state below exit_ratio * threshold ...
    exit_calls: int = 5  # ... for this many consecutive calls ...
    exit_horizon_ratio: float = 1.5  # ... with no forecast within exit_horizon_ratio * horizon_s

    @staticmethod
    def preset(name: str) -> "ForecastConfig":
        """'default'; 'eager' (short window, long horizon: demos); 'steady' (long window, fewer alarms)."""
        presets = {
            "default": ForecastConfig(),
            "eager": ForecastConfig(window=12, min_points=8, sign_agreement=0.75, horizon_s=60.0),
            "steady": ForecastConfig(window=32, min_points=12, sign_agreement=0.9, horizon_s=15.0, exit_calls=20),
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
        self._ts: deque[float] = deque(maxlen=self.cfg.window)
        self._cs: deque[tuple[float, ...]] = deque(maxlen=self.cfg.window)
        self.warning = False
        self._calm = 0
        self.n_observed = 0
        self.n_episodes = 0
        self.last: StreamRisk | None = None
        self._fc: tuple[float, float | None, float | None, float | None, tuple[float, ...]] | None = None
        self._since_fc = 0
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
        if self._ts and t < self._ts[-1]:  # clock went backwards (restarted producer): start over
            self._ts.clear()
            self._cs.clear()
            self._fc = None
        if not self._ts or t - self._ts[-1] >= self.cfg.min_spacing_s:
            self._ts.append(t)
            self._cs.append(coords)
        self.n_observed += 1
        eta = lo = hi = None
        vel: tuple[float, ...] = ()
        if p >= thr:
            eta = lo = hi = 0.0
            self._fc = None
        elif len(self._ts) >= self.cfg.min_points:
            self._since_fc += 1
            fc = self._fc
            if fc is None or self._since_fc >= self.cfg.refresh_calls or t - fc[0] >= self.cfg.refresh_s:
                eta, lo, hi, vel = self._forecast(thr)
                self._fc, self._since_fc = (t, eta, lo, hi, vel), 0
            else:  # between refits the forecast counts down (the trend costs ~50 us; a call ~10 us)
                dt = t - fc[0]
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

    # ------------------------------------------------------------------ trend and search

    def _trend(self) -> tuple[tuple[float, ...], tuple[float, ...], int, float, float]:
        """(level now, velocity, fastest feature, its q25 and q75 pair slopes) on the bin scale."""
        ts, cs = self._ts, self._cs
        n = len(ts)
        h = n // 2
        nf = len(cs[0])
        agree = self.cfg.sign_agreement
        vel, level = [0.0] * nf, list(cs[-1])
        fast, fq = -1, (0.0, 0.0)
        t_now = ts[-1]
        for i in range(nf):
            slopes = []
            for j in range(n - h):
                dt = ts[j + h] - ts[j]
                if dt > 0:
                    slopes.append((cs[j + h][i] - cs[j][i]) / dt)
            if len(slopes) < 2:
                continue
            pos = sum(1 for s in slopes if s > 0)
            neg = sum(1 for s in slopes if s < 0)
            if max(pos, neg) < agree * len(slopes):
                continue
            slopes.sort()
            k = len(slopes)
            med = slopes[k // 2] if k % 2 else 0.5 * (slopes[k // 2 - 1] + slopes[k // 2])
            if med == 0.0:
                continue
            vel[i] = med
            # the trend line's value now: median over points of c_j + med * (t_now - t_j)
            proj = sorted(c[i] + med * (t_now - tj) for c, tj in zip(cs, ts))
            level[i] = proj[len(proj) // 2]
            if fast < 0 or abs(med) > abs(vel[fast]):
                fast, fq = i, (slopes[k // 4], slopes[(3 * k) // 4])
        return tuple(level), tuple(vel), fast, fq[0], fq[1]

    def _forecast(self, thr: float) -> tuple[float | None, float | None, float | None, tuple[float, ...]]:
        level, vel, fast, q25, q75 = self._trend()
        if fast < 0:
            return None, None, None, vel
        vmax = max(abs(v) for v in vel)
        step = 0.25 / vmax
        n_steps = min(self.cfg.max_steps, int(self.cfg.lookahead_s / step) + 1)
        ti, m = self._ti, self._m
        last_region: tuple[int, ...] | None = None
        eta = None
        for k in range(1, n_steps + 1):
            tau = k * step
            region = tuple([int(c + v * tau) for c, v in zip(level, vel)])
            if region == last_region:
                continue
            last_region = region
            if m.max_probability_at(ti, region) >= thr:
                eta = tau
                break
        if eta is None or eta > self.cfg.lookahead_s:
            return None, None, None, vel
        med = vel[fast]
        fast_s, slow_s = (q75, q25) if med > 0 else (q25, q75)
        lo = eta * abs(med) / abs(fast_s) if fast_s * med > 0 else eta
        hi = eta * abs(med) / abs(slow_s) if slow_s * med > 0 else None
        return eta, min(lo, eta), (max(hi, eta) if hi is not None else None), vel


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
