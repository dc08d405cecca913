"""`optwin build --help` names the defaults of --replays and --cases that a build really uses: build.PRESETS.

    python -m pytest -q tests/test_cli_build_help_presets.py

The help strings were typed by hand and drifted: they said `quick 16, full 32` replays and `quick 32, full 128`
cases while the presets held quick 192 x 4 and full 384 x 8.
"""

from __future__ import annotations

import os
import subprocess
import sys

from optwin.fingerprints.build import PRESETS


def test_help_states_the_preset_sizes() -> None:
    # COLUMNS: rich wraps the help to the terminal; wide enough that each option's help stays on one line
    r = subprocess.run([sys.executable, "-m", "optwin.cli", "build", "--help"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert r.returncode == 0, r.stderr
    help_text = " ".join(r.stdout.split())
    q, f = PRESETS["quick"], PRESETS["full"]
    assert f"quick {q.replays}, full {f.replays}" in help_text, help_text
    assert f"quick {q.cases}, full {f.cases}" in help_text, help_text
