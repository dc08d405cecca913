"""Dynamic sampling: which calls of a stream get sketched and checked.

    python -c "from optwin.fingerprints.sampling import Sampler; s = Sampler(); print(sum(s.should_check() for _ in range(1000)))"

Checking costs a sketch (a handful of reductions on the device) and a lookup, so a long-running
model should not pay it on every call once a stream has shown what it looks like:
- the first `warmup_calls` (100) calls of a stream are all checked;
- then the rate is `min(1, max(min_rate, base_rate * sqrt(recent warning rate)))`, where the recent
  warning rate is an exponentially weighted mean over checked calls (weight `rate_alpha`): a calm
  stream is checked 1% of the time, a stream that keeps warning 10%;
- after `burst_after` (3) consecutive warnings the stream is checked on every call again for
  `burst_calls` (100) calls, so a stream walking into a fault region is followed closely.
Calls are picked deterministically (a credit accumulator: rate 0.01 checks every 100th call),
which keeps tests and benchmarks reproducible and spaces checks evenly in time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optwin.errors import CatalogError


@dataclass(frozen=True)
class SamplingConfig:
    warmup_calls: int = 100
    base_rate: float = 0.1
    min_rate: float = 0.01
    burst_after: int = 3
    burst_calls: int = 100
    rate_alpha: float = 0.05

    @staticmethod
    def preset(name: str) -> "SamplingConfig":
        """'default'; 'always' (check every call: tests, demos, offline); 'light' (long calm runs)."""
        presets = {
            "default": SamplingConfig(),
            "always": SamplingConfig(warmup_calls=0, base_rate=1.0, min_rate=1.0),
            "light": SamplingConfig(warmup_calls=50, min_rate=0.001, burst_calls=50),
        }
        try:
            return presets[name]
        except KeyError:
            raise CatalogError(f"unknown sampling preset {name!r}; expected one of {', '.join(presets)}") from None


class Sampler:
    """Per-stream sampling state. `should_check()` per call; `record(warned)` after each check."""

    __slots__ = ("cfg", "calls", "checked", "warn_rate", "consecutive", "burst_left", "_credit", "_steady")

    def __init__(self, config: SamplingConfig | None = None) -> None:
        self.cfg = config or SamplingConfig()
        self.calls = 0
        self.checked = 0
        self.warn_rate = 0.0
        self.consecutive = 0
        self.burst_left = 0
        self._credit = 0.0
        self._steady = self._steady_rate()

    def _steady_rate(self) -> float:
        """The rate past warm-up and bursts; it moves only with warn_rate (kept: rate is read per call)."""
        c = self.cfg
        return min(1.0, max(c.min_rate, c.base_rate * math.sqrt(self.warn_rate)))

    @property
    def rate(self) -> float:
        """The current check rate (1.0 during warm-up and bursts)."""
        if self.calls < self.cfg.warmup_calls or self.burst_left > 0:
            return 1.0
        return self._steady

    def should_check(self) -> bool:
        rate = self.rate
        self.calls += 1
        if self.burst_left > 0:
            self.burst_left -= 1
        if rate >= 1.0:
            return True
        self._credit += rate
        if self._credit >= 1.0:
            self._credit -= 1.0
            return True
        return False

    def record(self, warned: bool) -> None:
        """Feed back the verdict of a checked call."""
        self.checked += 1
        a = self.cfg.rate_alpha
        self.warn_rate += a * ((1.0 if warned else 0.0) - self.warn_rate)
        self._steady = self._steady_rate()
        self.consecutive = self.consecutive + 1 if warned else 0
        if self.consecutive >= self.cfg.burst_after and self.burst_left == 0:
            self.burst_left = self.cfg.burst_calls
