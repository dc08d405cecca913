"""One build at a time per database: an exclusive lock on `<out>.lock` while a build runs.

    with build_lock("fingerprints.duckdb"): ...   # a second build of the same --out stops with one error line

Why: a build starts by clearing `<out>.work` (unless --resume) and ends by swapping a copy onto `<out>`. Two builds
of one --out would delete each other's shards mid-run and the later swap would drop the earlier build. The lock is
an advisory flock, released by the kernel when its holder dies (kill -9 included), so a stale lock file never
blocks the next build; the holder removes the file on the way out.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from optwin.errors import OptwinError

try:
    import fcntl
except ImportError:  # not POSIX: no lock (one build at a time is then the user's to keep)
    fcntl = None  # type: ignore[assignment]


@contextlib.contextmanager
def build_lock(out: str) -> Iterator[None]:
    """Hold `<out>.lock` for the block, or raise OptwinError naming the build that holds it."""
    if fcntl is None:
        yield
        return
    path = f"{out}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OptwinError(f"{out}: another build (pid {holder}) is writing it; wait for it to end, "
                              "or build into another --out") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and our lock: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)  # while still locked: nobody can hold the old file's lock after it
        os.close(fd)
