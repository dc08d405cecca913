"""Freeze a revision of the `optwin` package under another name, so a bench can time it side by side
with the working tree in one process (bench/ab_kernels.py): A/B in interleaved rounds on one machine.

    python bench/ab_snapshot.py base --rev HEAD     # bench/.ab/optwin_base from git's HEAD
    python bench/ab_snapshot.py mine                # bench/.ab/optwin_mine from the working tree

The copy's own imports are renamed (`optwin.` -> `optwin_<name>.`), so its Triton kernels and module
state (workspaces, occupancy table) are separate from the live package's. bench/.ab is git-ignored:
carry it to the device (`run`'s carry=["bench/.ab"]).
"""

from __future__ import annotations

import argparse
import io
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AB_DIR = ROOT / "bench" / ".ab"


def _files(rev: str | None) -> dict[str, bytes]:
    """{path under optwin/: bytes} of the package's .py files at `rev` (None: the working tree)."""
    if rev is None:
        return {str(p.relative_to(ROOT)): p.read_bytes() for p in (ROOT / "optwin").rglob("*.py")}
    tar = subprocess.run(["git", "archive", "--format=tar", rev, "optwin"], cwd=ROOT, check=True,
                         capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile() and m.name.endswith(".py")}


def snapshot(name: str, rev: str | None, ab_dir: Path = AB_DIR) -> Path:
    """Write <ab_dir>/optwin_<name>/ (bench/.ab by default) and return it; put ab_dir on sys.path to
    import it."""
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise SystemExit(f"error: snapshot name {name!r}: use lower-case letters, digits and _")
    pkg = f"optwin_{name}"
    dest = ab_dir / pkg
    shutil.rmtree(dest, ignore_errors=True)
    for rel, data in _files(rev).items():
        text = re.sub(r"\boptwin(?=[.\s])", pkg, data.decode())
        out = dest / Path(rel).relative_to("optwin")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("--rev", default=None, help="git revision (default: the working tree)")
    args = ap.parse_args()
    print(snapshot(args.name, args.rev))


if __name__ == "__main__":
    main()
