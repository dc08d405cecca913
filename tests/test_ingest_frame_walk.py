"""Recorder._frame_module, the one frame walk behind Recorder.stream (a call's module path where no
hooked module runs) and Recorder.calling_module (the module whose is_causal an sdpa call reads).

    python -m pytest -q tests/test_ingest_frame_walk.py
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
from torch import nn

from optwin.ingest.capture import OWN_FRAMES, capture, own_frames


class _Leaf(nn.Module):
    """No hooks (classify_module does not know it): its calls are named by the frame walk alone."""

    def forward(self, probe: Callable[[], Any]) -> Any:
        return probe()

    def own(self, probe: Callable[[], Any]) -> Any:  # marked as the capture's own in one test
        return probe()


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.leaf = _Leaf()

    def forward(self, probe: Callable[[], Any]) -> Any:
        return probe(), self.leaf(probe), self.leaf.own(probe)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _Block()

    def forward(self, probe: Callable[[], Any]) -> Any:
        return self.block(probe)


def test_stream_and_calling_module_name_the_innermost_model_module() -> None:
    model, outsider = _Model(), _Leaf()
    with torch.no_grad(), capture(model) as rec:
        def probe() -> tuple[str, nn.Module | None, nn.Module | None]:
            return rec.stream, rec.calling_module(), rec._frame_module(sys._getframe())

        outside = probe()
        in_block, in_leaf, in_own = model(probe)
        through_outsider = model(lambda: outsider(probe))[1]  # a module outside the model is passed over
        assert rec._frame_module(None) is None
    assert outside == ("", None, None)
    assert in_block == ("block", model.block, model.block)
    assert in_leaf == ("block.leaf", model.block.leaf, model.block.leaf)
    assert in_own == in_leaf  # not marked: the leaf's other method counts like forward
    assert through_outsider == in_leaf


def test_the_walk_passes_over_the_captures_own_frames() -> None:
    """A frame marked with own_frames is skipped even where its `self` is a model module: the next
    module out is named (the capture's machinery sits between an intercepted call and the model)."""
    model = _Model()
    code = _Leaf.own.__code__
    own_frames(_Leaf.own)
    try:
        with torch.no_grad(), capture(model) as rec:
            in_own = model(lambda: (rec.stream, rec.calling_module()))[2]
    finally:
        OWN_FRAMES.discard(code)
    assert in_own == ("block", model.block)
