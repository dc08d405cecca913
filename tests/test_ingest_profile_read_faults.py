"""Reading a profile turns the file's faults into ProfileError, and only those.

    python -m pytest -q tests/test_ingest_profile_read_faults.py

The three readers (sketch parquet, safetensors index, lazy sample) caught BaseException less
KeyboardInterrupt/SystemExit, so a MemoryError or GeneratorExit came back as "corrupt file".
A Rust panic (pyo3's PanicException, a BaseException) must still be a ProfileError.
"""

from __future__ import annotations

from pathlib import Path

import polars
import pytest
import safetensors
import torch

from optwin.errors import ProfileError
from optwin.ingest import read_profile
from optwin.ingest.capture import capture
from optwin.ingest.profile import write_profile


class PanicException(BaseException):  # what pyo3 raises for a panic in Rust code
    pass


def _raiser(exc: BaseException):  # noqa: ANN202
    def f(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise exc
    return f


@pytest.fixture
def prof(tmp_path: Path) -> Path:
    with capture(sample_rate=1.0, capacity=4, seed=0) as rec:
        torch.softmax(torch.randn(2, 4), -1)
    return write_profile(tmp_path / "p", rec, model="m")


@pytest.mark.parametrize("where", ["parquet", "index", "sample"])
def test_only_file_faults_become_profile_errors(prof: Path, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    p = read_profile(prof)
    for exc, blamed in ((MemoryError(), False), (GeneratorExit(), False), (PanicException("bad page"), True),
                        (ValueError("bad header"), True)):
        with monkeypatch.context() as m:
            if where == "parquet":
                m.setattr(polars, "read_parquet", _raiser(exc))
            else:
                m.setattr(safetensors, "safe_open", _raiser(exc))
            call = (lambda: p.sample(0)) if where == "sample" else (lambda: read_profile(prof))
            if blamed:
                with pytest.raises(ProfileError) as ei:
                    call()
                assert type(exc).__name__ in str(ei.value) and "\n" not in str(ei.value)
            else:
                with pytest.raises(type(exc)):
                    call()
