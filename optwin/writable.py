"""Whether an output path can be written, checked before any work starts, as one OptwinError line naming the option.

os.access says yes to root on read-only mounts and /proc, so the check makes (and removes) a directory where the
output goes: the first real write used to fail late with a bare OSError.
"""

from __future__ import annotations

import os
import tempfile

from optwin.errors import OptwinError


def check_writable_in(option: str, shown: object, path: str | os.PathLike) -> None:
    """Raise OptwinError (`{option} {shown}: ...`) unless a file or directory can be made at `path`: the nearest
    existing directory at or above it takes a new entry (whether what is missing above it may be made is the
    caller's rule: build's --out refuses a missing directory, fingerprints.build.check_out)."""
    above = os.path.abspath(path)
    while not os.path.lexists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise OptwinError(f"{option} {shown}: {above} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".optwin-probe-", dir=above))
    except OSError as e:
        raise OptwinError(f"{option} {shown}: cannot write in {above} ({e.strerror or e})") from None
