"""Watch a module's file writes for durability: its os.open, os.fsync and os.replace wrapped to log, in order,
("fsync", path) for each fsync of a file or directory opened by path, and ("replace", src, dst) for each rename."""

from __future__ import annotations

import os


def watch_durable_writes(monkeypatch, module) -> list[tuple[str, ...]]:
    events: list[tuple[str, ...]] = []
    real_fsync, real_open, real_replace = os.fsync, os.open, os.replace
    names: dict[int, str] = {}

    def opened(path, flags, *a, **k):
        fd = real_open(path, flags, *a, **k)
        names[fd] = os.fspath(path)
        return fd

    def fsync(fd):
        events.append(("fsync", names.get(fd, "?")))
        real_fsync(fd)

    def replace(a, b):
        events.append(("replace", os.fspath(a), os.fspath(b)))
        real_replace(a, b)

    monkeypatch.setattr(module.os, "open", opened)
    monkeypatch.setattr(module.os, "fsync", fsync)
    monkeypatch.setattr(module.os, "replace", replace)
    return events
