"""Our operator kernels: the production variants as plain torch, and Triton kernels that emit the
input sketch in the same pass as the operator.

    python -c "import optwin.kernels as k; print(k.run_variant)"

Importing this package never imports triton: the Triton modules (rmsnorm, softmax, layernorm, rope,
patch) load it when they are imported themselves.
"""

from __future__ import annotations

from typing import Any

from optwin.kernels.production import run_variant

__all__ = ["patch", "read_sketch", "run_variant"]


def patch(model: Any, **kwargs: Any) -> Any:
    """Swap a Hugging Face model's norms, softmax and rotary application for our kernels.

    Returns an undo handle (see optwin.kernels.patching.Patch). Imports triton.
    """
    from optwin.kernels.patching import patch as _patch

    return _patch(model, **kwargs)


def read_sketch(op: str, buffer: Any, shape: Any, params: dict[str, Any] | None = None) -> dict[str, float]:
    """The sketch dict (sketch-contract keys) from a kernel's sketch buffer; `shape` is the main
    input's shape. Imports no triton (see optwin.kernels.sketch_buffer)."""
    from optwin.kernels.sketch_buffer import read_sketch as _read

    return _read(op, buffer, shape, params)
