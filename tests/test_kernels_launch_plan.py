"""optwin.kernels.launch_plan: a launcher's kernel, grid and options are worked out once per key and kept;
the key must fix everything Triton specializes on but the tensors' alignment (fast_launch.launch_keyed
rests on it), and a kept plan must launch exactly what a fresh one would."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (the kernels read it at decoration)

import pytest  # noqa: E402
import torch  # noqa: E402

from optwin.kernels import fast_launch, launch_plan, read_sketch  # noqa: E402
from optwin.kernels.fast_launch import _key  # noqa: E402
from optwin.kernels.layernorm import layernorm  # noqa: E402
from optwin.kernels.rmsnorm import rmsnorm  # noqa: E402
from optwin.kernels.rope import rope  # noqa: E402
from optwin.kernels.softmax import softmax  # noqa: E402


def _recorded(monkeypatch) -> list[tuple]:
    """Every planned launch from now on, as (plan key, kernel, grid, args, kwargs), still launched."""
    calls: list[tuple] = []
    real = launch_plan.launch_keyed

    def recording(key, kernel, grid, args, kwargs):
        calls.append((key, kernel, grid, args, kwargs))
        return real(key, kernel, grid, args, kwargs)

    monkeypatch.setattr(launch_plan, "launch_keyed", recording)
    return calls


def _ops(x: torch.Tensor) -> dict:
    """One call of each planned launcher on x (rows of x.shape[-1]), sketched."""
    n = x.shape[-1]
    w = torch.linspace(0.5, 1.5, n, dtype=x.dtype)
    return {
        "rmsnorm": lambda: rmsnorm(x, w),
        "layernorm": lambda: layernorm(x, w, w * 0.1),
        "softmax": lambda: softmax(x),
        "rope": lambda: rope(x[:, : n // 4 * 4].reshape(x.shape[0], 2, n // 4 * 2), torch.arange(x.shape[0]) * 37),
    }


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "softmax", "rope"])
def test_a_kept_plan_launches_what_a_fresh_one_does(op, monkeypatch):
    """Calls of one key launch the same kernel, grid, options and non-tensor arguments whether their plan
    is fresh or kept, with the same y and sketch. The plan is kept once its kernel's occupancy was
    recorded (by the first launch, unless an earlier one of the same kernel did), so by the second call."""
    launch_plan.clear()
    x = torch.randn(7, 96, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    x[2, 5] = float("inf")
    fn = _ops(x)[op]
    calls = _recorded(monkeypatch)
    y1, b1 = fn()
    fn()
    assert len(launch_plan._KEPT) == 1
    kept = next(iter(launch_plan._KEPT.values()))
    y2, b2 = fn()
    assert next(iter(launch_plan._KEPT.values())) is kept and len(calls) == 3
    (k1, kern1, g1, a1, o1), _, (k2, kern2, g2, a2, o2) = calls
    assert k1 in (k2, (k2, "unsettled")) and kern1 is kern2 and g1 == g2 and o1 == o2  # unsettled: a first launch
    assert [a for a in a1 if not isinstance(a, torch.Tensor)] == [a for a in a2 if not isinstance(a, torch.Tensor)]
    assert torch.equal(y1.view(torch.int16), y2.view(torch.int16))
    shape = (7, 2, 48) if op == "rope" else x.shape
    params = {"base": 10000.0} if op == "rope" else None
    assert read_sketch(op, b1, shape, params) == read_sketch(op, b2, shape, params)


def test_keys_part_where_the_launch_differs(monkeypatch):
    """Another dtype, row length, row stride, start in 16 bytes, or the sketch off: another plan."""
    launch_plan.clear()
    calls = _recorded(monkeypatch)
    base = torch.randn(9, 104)
    w = torch.ones(96)
    variants = [base[:, :96], base[:, :96].to(torch.bfloat16), base[:, 1:97], base[:8, :96].contiguous(),
                base[:, :96].contiguous()]
    for _ in range(2):  # the first call of a kernel records its occupancy; the second keeps the plan
        for x in variants:
            rmsnorm(x, w.to(x.dtype))
        rmsnorm(variants[-1], w, sketch=False)
    settled = {c[0] for c in calls if c[0][-1] != "unsettled"}  # a kernel's first launches: (key, "unsettled")
    assert len(settled) == len(variants) + 1 == len(launch_plan._KEPT)


def test_plan_keys_fix_what_triton_specializes(monkeypatch):
    """The property launch_keyed rests on: calls with the same plan key and the same tensor alignment have
    the same full fast_launch key (the same Triton specialization, constexprs and options), over shapes,
    dtypes, strides, offsets and sketch on/off that share many specialization classes."""
    launch_plan.clear()
    calls = _recorded(monkeypatch)
    g = torch.Generator().manual_seed(0)
    for rows, n in ((5, 96), (3, 781), (16, 4096), (2, 48)):
        for dt in (torch.bfloat16, torch.float32):
            big = torch.randn(rows, n + 8, generator=g).to(dt)
            for x in (big[:, :n], big[:, 1:n + 1], big[:, 2:n + 2], big[:, :n].contiguous()):
                for fn in _ops(x).values():
                    fn()
                softmax(x, sketch=False)
                rmsnorm(x, torch.ones(n, dtype=dt), sketch=False)
    seen: dict = {}
    for key, kernel, grid, args, kwargs in calls:
        aligned = tuple(a.data_ptr() & 15 == 0 for a in args if isinstance(a, torch.Tensor))
        full = _key(kernel, 0, grid, args, kwargs)
        assert seen.setdefault((key, aligned), full) == full, key
    assert len(seen) > 40
    assert not fast_launch._state["direct"]  # the interpreter: every call went through Triton


def test_deferred_softmax_keeps_its_plan(monkeypatch):
    """A patched model's softmax defers every call (a program per row, no finisher in the launch): the plan
    that holds the deferred form is kept like any other, not built again on every call."""
    from optwin.kernels import deferred
    from optwin.kernels import softmax as softmax_mod

    monkeypatch.setattr(softmax_mod, "ROWS_BLOCKS", {16})  # rows of 16 take the row launch
    monkeypatch.setattr(launch_plan, "_KEPT", {})  # plans read ROWS_BLOCKS when built
    built = []
    real_plan = softmax_mod._softmax_plan
    monkeypatch.setattr(softmax_mod, "_softmax_plan", lambda *a: built.append(1) or real_plan(*a))
    calls = _recorded(monkeypatch)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    want = softmax(x, defer=False)[1]
    bufs = [softmax(x, defer=True)[1] for _ in range(4)]
    deferred.settle_all()
    assert len(built) <= 3  # the in-launch call's, then the deferred one's until its occupancy is known
    assert [c[2] for c in calls[1:]] == [(4,)] * 4  # a program per row, no finisher program
    shape = tuple(x.shape)
    assert all(read_sketch("softmax", b, shape) == read_sketch("softmax", want, shape) for b in bufs)


def test_a_plan_from_before_the_occupancy_leaves_no_values_behind(monkeypatch):
    """The first launch of a kernel runs a plan built at the default occupancy; once the launch recorded the
    real one, the kept plan's values (here the prefetch distance, pf_ahead = resident programs) are what
    fast_launch's direct path launches with, not the first plan's (fast_launch binds a key's options once)."""
    import types

    from _kernel_checks import bench_script

    from optwin.kernels import _common
    from optwin.kernels.fast_launch import _rest
    from optwin.kernels.layernorm_welford import (
        _layernorm_welford_kernel,
        _welford_launch,
    )

    launch_cost = bench_script("launch_cost")
    monkeypatch.setattr(_common, "_OCCUPANCY", {})
    monkeypatch.setattr(launch_plan, "_KEPT", {})
    monkeypatch.setattr(launch_cost._NoKernel, "n_regs", 32)  # 16 programs of 4 warps an SM, not the default 2
    monkeypatch.setattr(launch_cost._NoKernel, "metadata", types.SimpleNamespace(shared=0))
    runs: list[tuple] = []
    monkeypatch.setattr(launch_cost._NoKernel, "run", lambda self, *a: runs.append(a))
    x = torch.randn(5, 4096)
    w = torch.ones(4096)
    y = torch.empty_like(x)
    with launch_cost.triton_left_out():
        for _ in range(4):
            _welford_launch(x, w, w, y, None, 1e-5, prefetch=1.0)  # rows of 4096: 4 warps
    names = [n for n, _ in _rest(_layernorm_welford_kernel, 13)]
    ahead = [a[9 + 13 + names.index("pf_ahead")] for a in runs]
    resident = 16 * _common._sms(x.device)
    assert ahead and all(v == resident for v in ahead), ahead


def test_clear_forgets_the_plans():
    x = torch.randn(3, 64)
    rmsnorm(x, torch.ones(64))
    assert launch_plan._KEPT
    launch_plan.clear()
    assert not launch_plan._KEPT
