"""first_line: the one helper for the first line of a driver's or library's message in an optwin error.

    python -m pytest -q tests/test_errors_first_line.py

The idiom was written out at each site (duckdb_store, engines, sidecar), two of them without the strip, so a
message starting with a newline gave an empty reason.
"""

from __future__ import annotations

from optwin.errors import first_line


def test_first_line_of_a_message_or_the_type_name():
    assert first_line(RuntimeError("IO Error: no\nsecond line")) == "IO Error: no"
    assert first_line(ValueError("\n  leading blank line\nmore")) == "leading blank line"
    assert first_line(OSError()) == "OSError"
    assert first_line(RuntimeError("   ")) == "RuntimeError"
