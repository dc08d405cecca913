"""torch's CUDA reduce (Numerics._cuda_reduce) against an H100's row sums, bit for bit.

bench/gpu_softmax_sums.py summed seeded rows x (float16, bfloat16, float32) on an H100 with x.sum(-1,
dtype=torch.float32): terms the CPU knows exactly, so the order alone decides the float32 result
(bench/results/softmax_sums_gpu_h100_s49.npz; `python bench/twin_softmax_sums.py` prints the whole table). Before
stop 49 the twin read every row as float32 vectors of 4 from 129 elements on, fell back to "blocked" for rows
split over a block's warps and for unaligned rows, and so missed rows in each case below.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from gpu_softmax_sums import rows_of  # noqa: E402

from optwin.twin.numerics import Numerics  # noqa: E402

GPU = np.load(os.path.join(ROOT, "bench", "results", "softmax_sums_gpu_h100_s49.npz"))


@pytest.mark.parametrize("dtype,n,rows", [
    ("float32", 128, 64),  # 128 elements are read as vectors already (100 are not)
    ("float16", 384, 64),  # 16-bit rows: vectors of 8, not 4
    ("bfloat16", 2048, 64),
    ("float32", 130, 64),  # rows not on a 16-byte boundary: head and tail summed apart
    ("float16", 130, 512),
    ("float32", 8192, 64),  # a row split over the block's warps: lanes first, then warps
    ("bfloat16", 8192, 512),
])
def test_cuda_order_is_the_h100s_row_sums(dtype: str, n: int, rows: int) -> None:
    x = rows_of(dtype, n, rows)
    gpu = torch.from_numpy(GPU[f"{dtype}_{n}_{rows}_xsum32"]).double()
    got = Numerics().sum(x.double(), acc="float32", order="cuda", outputs=rows, itemsize=x.element_size())
    assert int((got == gpu).sum()) == rows


def test_noisy_replays_keep_their_replay_dim() -> None:
    """Under stochastic rounding each replay draws its own noise along the leading replay dim, which the rows'
    misalignment groups never split (replays run in batches are the unbatched replays: test_twin_run's
    test_replays_in_batches_are_the_unbatched_replays)."""
    x = rows_of("float32", 130, 8).double()
    together = Numerics("stochastic", replays=3, seed=5).sum(x.expand(3, 8, 130), order="cuda", outputs=8)
    assert together.shape == (3, 8)
    assert not torch.equal(together[0], together[1])  # the replays differ ...
    determ = Numerics().sum(x, order="cuda", outputs=8)
    assert ((together - determ).abs() <= 2 ** -20 * determ.abs()).all()  # ... by float32 roundings only
