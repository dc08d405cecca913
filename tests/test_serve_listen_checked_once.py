"""`optwin serve` checks its listen address once.

    python -m pytest -q tests/test_serve_listen_checked_once.py

serve_cli checked it (before its database checks) and serve() checked it again: a unix socket was cleared, bound
and removed twice per start, for nothing.
"""

from __future__ import annotations

import pytest

from optwin.fingerprints import sidecar
from optwin.fingerprints.serve_cli import serve_command
from _matcher_fixture import cached_db


def test_serve_command_checks_the_address_once(tmp_path, monkeypatch):
    db = cached_db(str(tmp_path / "fp.duckdb"))
    calls: list[str] = []
    real = sidecar.check_listen
    monkeypatch.setattr(sidecar, "check_listen", lambda address, token: (calls.append(str(address)),
                                                                         real(address, token))[1])

    async def started(self) -> None:  # the real start, stopped at once: the test is about what comes before
        return None

    monkeypatch.setattr(sidecar.Sidecar, "serve_forever", started)
    sock = str(tmp_path / "s.sock")
    serve_command(db=db, listen=f"unix://{sock}", token=None, warnings_jsonl=None, max_records_per_s=None,
                  max_streams=1000, stream_ttl_s=None, log_level="WARNING")
    assert len(calls) == 1, calls


def test_serve_alone_still_checks_the_address(tmp_path):
    db = cached_db(str(tmp_path / "fp.duckdb"))
    with pytest.raises(sidecar.ListenError, match="without --token"):
        sidecar.serve(db, listen="tcp://0.0.0.0:0")
