"""optwin: operator digital twins and fault fingerprints for GPU operators in LLM inference.

    optwin demo

Subpackages: `twin` (FP64 twins with emulated numerics), `ingest` (sketches, capture, profiles),
`fingerprints` (DuckDB fault database, matcher, sidecar), `kernels` (GPU variants, Triton kernels),
`dashboard` (Streamlit). `import optwin` stays light: heavy parts load on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "monitor"]


def monitor(*args, **kwargs):
    """Watch a model's operator calls against a fingerprint database; see `optwin.monitor_impl`."""
    from optwin.monitor import monitor as _monitor

    return _monitor(*args, **kwargs)
