"""The L2 prefetch of the softmax, rmsnorm and layernorm launches (_common.prefetch_l2): when a row may be
prefetched (cp.async.bulk's 16-byte rule), where the launch table turns it on, and that the launchers'
prefetch argument changes neither y nor the sketch. The prefetch instruction itself is compiled only for
NVIDIA sm_90+ (the interpreter runs the launch path without it); on the H200, bench/norm_chunks.py checks
y bit for bit and the sketch against ingest with it on (bench/RESULTS.md, stop 22).

    python -m pytest -q tests/test_kernels_prefetch.py
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import pytest
import torch

from optwin.kernels._common import (
    PREFETCH,
    PREFETCH_ON_DEVICE,
    TUNED_BY_ELEMENT,
    bulk_row_bytes,
    depth_on,
    launch_config,
    prefetch_bytes,
)
from optwin.kernels.sketch_buffer import new_buffer, read_sketch
from optwin.kernels.softmax import _softmax_launch, unaligned_warps


def test_bulk_rule_needs_aligned_row_starts_and_rounds_the_size_down():
    assert bulk_row_bytes(4096, 32768, 32768) == 32768
    assert bulk_row_bytes(4096, 1568, 1562) == 1552  # 781 bf16 in rows of 784: the last 10 bytes left out
    assert bulk_row_bytes(4104, 32768, 32768) == 0  # base only 8-byte aligned
    assert bulk_row_bytes(4096, 1562, 1562) == 0  # row stride 1562 bytes: every other row start misaligned
    assert bulk_row_bytes(4096, 32, 8) == 0  # less than 16 bytes: nothing to ask for


def test_no_prefetch_off_the_gpu():
    assert prefetch_bytes(torch.zeros(4, 4096, dtype=torch.bfloat16)) == 0


def test_prefetch_is_only_for_measured_launches():
    assert all(esize in (2, 4) for _, _, esize, _ in PREFETCH)
    # float32 layernorm lost with it at every width, and float32 rows of 32768 with every op
    assert not any(esize == 4 and (op == "layernorm" or b > 16384) for op, b, esize, _ in PREFETCH)
    assert ("softmax", 4096, 2, True) not in PREFETCH  # 16384x4096 lost with it on the H200
    assert PREFETCH[("layernorm", 16384, 2, True)] < 1  # float16 4096x16384: 73.7 -> 84.7 µs a wave ahead (H200)
    # 16-bit rows: layernorm lost without the sketch at every width; rmsnorm but at rows of 4096
    assert not any(not sketch for op, b, esize, sketch in PREFETCH
                   if esize == 2 and (op == "layernorm" or (op, b) == ("rmsnorm", 16384)))


def test_a_gpu_with_its_own_timings_takes_its_own_depths():
    # the H100 lost with layernorm's sketched prefetch at every row length (fp16 4096x16384 +5 % against +1 %);
    # the H200 keeps the table's half wave, and the H100 the table's other launches
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    for b in (4096, 8192, 16384):
        assert depth_on(h100, ("layernorm", b, 2, True)) == 0
        assert depth_on(h200, ("layernorm", b, 2, True)) == PREFETCH[("layernorm", b, 2, True)] > 0
        assert depth_on("", ("layernorm", b, 2, True)) == PREFETCH[("layernorm", b, 2, True)]
    assert depth_on(h100, ("softmax", 16384, 2, True)) == PREFETCH[("softmax", 16384, 2, True)] == 1
    assert depth_on(h100, ("layernorm", 16384, 4, True)) == 0  # in neither table
    assert all(k in PREFETCH for table in PREFETCH_ON_DEVICE.values() for k in table)  # overrides, never additions


def test_float32_rows_take_their_own_measured_launch():
    # the 16-bit sketch kernel capped at 64 registers spilled 736 bytes on float32 rows of 16384
    assert launch_config("softmax", 16384, esize=4).warps == 32
    assert launch_config("softmax", 16384, esize=2).warps == 8
    # 16-bit softmax rows: 64 elements a thread (at least 2 warps), 128 at BLOCK 65536 (32 warps lost there);
    # float32 keeps the warps it was timed with
    assert [launch_config("softmax", b, esize=2).warps for b in (2048, 4096, 8192, 16384, 32768, 65536)] == [
        2, 2, 4, 8, 16, 16]
    assert [launch_config("softmax", b, esize=4).warps for b in (2048, 4096, 8192, 32768)] == [8, 8, 16, 32]
    # rows of 1025..2048 that no power of two divides (element loads) keep 8 warps; aligned ones take TUNED's
    assert unaligned_warps(2047, 2, 1) == 8 and unaligned_warps(1025, 2, 1) == 8
    assert unaligned_warps(2048, 2, 16) is None and unaligned_warps(4095, 2, 1) is None
    assert unaligned_warps(2047, 4, 1) is None
    assert launch_config("rmsnorm", 16384, esize=4)[1:3] == (8, 1)
    assert launch_config("rmsnorm", 16384, esize=2)[1:3] == (8, 2)
    # one warp count with and without the sketch (the tl.sum trees, so y, stay the same)
    for op, block, esize in TUNED_BY_ELEMENT:
        assert launch_config(op, block, esize=esize, sketch=True).warps == launch_config(op, block, esize=esize).warps


def _launch(op: str, x: torch.Tensor, y: torch.Tensor, buf: torch.Tensor, depth: int) -> None:
    n = x.shape[1]
    if op == "softmax":
        _softmax_launch(x, y, buf, prefetch=depth)
    elif op == "rmsnorm":
        from optwin.kernels.rmsnorm import EPS, _rmsnorm_launch

        _rmsnorm_launch(x, torch.ones(n, dtype=x.dtype), y, buf, EPS, prefetch=depth)
    else:
        from optwin.kernels.layernorm import EPS, _layernorm_launch

        _layernorm_launch(x, torch.ones(n, dtype=x.dtype), torch.zeros(n, dtype=x.dtype), y, buf, EPS,
                          welford=True, prefetch=depth)


@pytest.mark.parametrize("op", ["softmax", "rmsnorm", "layernorm"])
def test_asking_for_a_prefetch_changes_nothing(op):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(9, 4096 if op == "layernorm" else 520, generator=g) * 4).to(torch.bfloat16)
    if op == "softmax":
        x[2, ::3] = -float("inf")
    out = []
    for depth in (0, 1):
        y = torch.empty_like(x)
        buf = new_buffer(op, x.device)
        _launch(op, x, y, buf, depth)
        out.append((y, read_sketch(op, buf)))
    assert torch.equal(out[0][0].view(torch.int16), out[1][0].view(torch.int16))
    assert out[0][1] == out[1][1]
