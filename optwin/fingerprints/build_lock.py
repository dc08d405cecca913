"""One writer at a time per database: an exclusive lock on `<out>.lock` while a build or a migrate runs.

    with build_lock("fingerprints.duckdb"): ...   # a second build of the same --out stops with one error line
    with build_lock("fingerprints.duckdb", "migrate"): ...   # `optwin migrate` takes the same lock

Why: a build starts by clearing `<out>.work` (unless --resume) and ends by swapping a copy onto `<out>`. Two builds
of one --out would delete each other's shards mid-run and the later swap would drop the earlier build. The lock is
an advisory flock, released by the kernel when its holder dies (kill -9 included), so a stale lock file never
blocks the next build; the holder removes the file on the way out. `optwin migrate` also swaps a copy onto the file,
so it holds the same lock: otherwise a build finishing during a migrate would be undone by the migrate's swap.
The lock file holds "<pid> <what>" of its holder, for the other writer's error line.
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
def build_lock(out: str, what: str = "build") -> Iterator[None]:
    """Hold `<out>.lock` for the block (`what`: "build" or "migrate", the holder's kind), or raise OptwinError
    naming the build or migrate that holds it."""
    if fcntl is None:
        yield
        return
    path = f"{out}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").split()
            os.close(fd)
            pid, kind = (holder[0] if holder else "?"), (holder[1] if len(holder) > 1 else "build")
            who = "another build" if kind == "build" else f"optwin {kind}"
            advice = "wait for it to end, or build into another --out" if what == "build" else "wait for it to end"
            raise OptwinError(f"{out}: {who} (pid {pid}) is writing it; {advice}") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and our lock: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {what}".encode(), 0)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)  # while still locked: nobody can hold the old file's lock after it
        os.close(fd)
