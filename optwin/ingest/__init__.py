"""Input capture from PyTorch models, input profiles, their distributions and samplers.

    python -c "import optwin.ingest as i; print(i.SKETCH_FEATURES['rmsnorm'])"

`import optwin.ingest` loads only the sketch (torch + the catalog). Everything else (capture
hooks, profiles with polars/safetensors, scipy fits, generators) loads on first attribute access, so
the matcher's hot path inside inference processes stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from optwin.ingest.sketch import SKETCH_FEATURES, sketch, sketch_tensor, validate_sketch

# attribute -> submodule that defines it (loaded lazily)
_LAZY: dict[str, str] = {
    "Case": "optwin.ingest.generate",
    "default_sweep": "optwin.ingest.generate",
    "boundary_sweep": "optwin.ingest.generate",
    "capture": "optwin.ingest.capture",
    "CaptureSettings": "optwin.ingest.capture",
    "Recorder": "optwin.ingest.capture",
    "Profile": "optwin.ingest.profile",
    "read_profile": "optwin.ingest.profile",
    "write_profile": "optwin.ingest.profile",
    "read_sketch_log": "optwin.ingest.logs",
    "SketchLog": "optwin.ingest.logs",
    "Fitted": "optwin.ingest.fit",
    "fit_profile": "optwin.ingest.fit",
    "fit_sketches": "optwin.ingest.fit",
    "sample_inputs": "optwin.ingest.fit",
}

__all__ = ["SKETCH_FEATURES", "sketch", "sketch_tensor", "validate_sketch", *_LAZY]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'optwin.ingest' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value
