"""Seeds draw from all of their bits: 2**32 is not seed 0 and -1 is not 2**32-1.

    python -m pytest -q tests/test_ingest_seed_bits.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from optwin.ingest import default_sweep, fit_sketches, sample_inputs
from optwin.ingest.capture import capture
from optwin.ingest.generate import case_rng
from optwin.ingest.profile import sketch_frame

# Seeds that the low 32 bits alone used to fold together, pairwise.
ALIASES = [(0, 2**32), (2**32 - 1, -1), (5, 2**40 + 5), (7, -(2**32) + 7)]


def _same(a: list, b: list) -> bool:  # noqa: ANN001
    return all(torch.equal(x.inputs[k], y.inputs[k]) for x, y in zip(a, b) for k in x.inputs)


@pytest.fixture(scope="module")
def fitted():  # noqa: ANN201
    torch.manual_seed(0)
    with capture() as rec:
        for i in range(12):
            torch.softmax(torch.randn(8, 24) * (1 + i), -1)
    return fit_sketches(sketch_frame(rec.records()))


@pytest.mark.parametrize("a,b", ALIASES)
def test_aliased_seeds_draw_different_inputs(fitted, a: int, b: int) -> None:  # noqa: ANN001
    assert case_rng(a, "softmax", 3).random() != case_rng(b, "softmax", 3).random()
    assert not _same(default_sweep("softmax", "float32", 4, a), default_sweep("softmax", "float32", 4, b))
    assert not _same(sample_inputs("softmax", "float32", fitted, 4, a), sample_inputs("softmax", "float32", fitted, 4, b))


def test_seeds_stay_deterministic_and_32_bit_seeds_keep_their_streams(fitted) -> None:  # noqa: ANN001
    for s in (0, 2**32, -1, 2**63 + 11):
        assert _same(sample_inputs("softmax", "float32", fitted, 3, s), sample_inputs("softmax", "float32", fitted, 3, s))
    # Seeds below 2**32 draw what they always drew (stored builds and results stay reproducible).
    assert case_rng(12345, "softmax", 2, 1).random() == np.random.default_rng([12345, 1, 2, 1]).random()
