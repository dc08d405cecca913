"""A sidecar monitor follows warning episodes and feeds the sidecar's verdicts to its sampling.

    python -m pytest -q tests/test_monitor_sidecar_episodes.py

A real sidecar (SidecarThread on the fixture database, HTTP on loopback) answers a monitor of a
T5-style RMSNorm that squares in float16 (|x| past 256 overflows: the fixture's native-dtype
fingerprints know it). The local matcher is the reference: the sidecar runs the same Stream code.
"""

from __future__ import annotations

import torch

import optwin.monitor as om
from _monitor_fixture import NativeRMSNorm, fake_clock, rows_of_absmax
from optwin.fingerprints.forecast import ForecastConfig
from optwin.fingerprints.sidecar import SidecarConfig, SidecarThread


def _episodes(**mon_kwargs) -> om.Monitor:
    """Fault (|x| 600), recover (|x| 1) for longer than the exit hysteresis, fault again."""
    mod = NativeRMSNorm(64)
    g = torch.Generator().manual_seed(7)
    with om.monitor(mod, sampling="always", clock=fake_clock(), **mon_kwargs) as mon, torch.no_grad():
        for absmax in (600.0, 1.0, 600.0):
            for _ in range(40):
                mod(rows_of_absmax(g, absmax))
            mon.flush()  # the sidecar answers this phase before the next one starts
    return mon


def test_a_sidecar_monitor_warns_once_per_episode_like_the_local_matcher(db):
    local = _episodes(db=db)
    assert [w["source"] for w in local.warnings] == ["local", "local"]
    with SidecarThread(db, config=SidecarConfig(max_lag_s=60.0)) as sc:  # shares the GIL: lag is not overload
        remote = _episodes(sidecar=sc.url)
    assert remote.client.stats.sent == 120 and remote.client.stats.errors == 0
    # the second fault is a new episode: it warns again (it used to stay silent for good)
    assert [w["source"] for w in remote.warnings] == ["sidecar", "sidecar"]
    assert [w["stream"] for w in remote.warnings] == [w["stream"] for w in local.warnings]
    # warn=True answers: every faulting call and the first exit_calls - 1 calm ones (hysteresis),
    # yet one event per episode
    assert remote.client.stats.warnings == 40 + ForecastConfig().exit_calls - 1 + 40


def _always_faulting(calls: int, **mon_kwargs) -> om.Monitor:
    """Default sampling; every call faults. The sidecar is given time to answer every 50 calls."""
    mod = NativeRMSNorm(64)
    g = torch.Generator().manual_seed(8)
    with om.monitor(mod, clock=fake_clock(), **mon_kwargs) as mon, torch.no_grad():
        for i in range(calls):
            mod(rows_of_absmax(g, 600.0))
            if i % 50 == 49:
                mon.flush()
    return mon


def test_a_sidecar_monitors_sampling_follows_the_sidecars_warnings(db):
    local = _always_faulting(1100, db=db)
    assert local.stats.checked == 1100  # warming up, then bursting: every call
    with SidecarThread(db, config=SidecarConfig(max_lag_s=60.0)) as sc:
        remote = _always_faulting(1100, sidecar=sc.url)
    assert remote.client.stats.warnings == remote.stats.checked  # every answer said warn
    # it stayed at the calm 1 % (110 checks) while every answer warned; now the verdicts reach the
    # sampler (up to 50 calls late: the sidecar answers asynchronously) and it bursts
    assert remote.stats.checked >= 1000, remote.stats
