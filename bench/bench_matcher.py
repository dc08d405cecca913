"""Matcher latency: assess from a sketch, from tensors (sketch cost apart), and stream observe.

    python bench/bench_matcher.py [--db fingerprints.duckdb] [--n 20000]

Without --db it builds the tests' fixture database (real rmsnorm twin runs) in a temp dir.
Goal: assess from a sketch p50 <= 20 us, p99 <= 100 us.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def timeit(fn, args_list) -> list[float]:
    out = []
    for a in args_list:
        t0 = time.perf_counter_ns()
        fn(a)
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def row(name: str, us: list[float]) -> str:
    return f"{name:<44} n={len(us):>6}  p50={pct(us, 0.5):8.2f} us  p99={pct(us, 0.99):8.2f} us  mean={sum(us)/len(us):8.2f} us"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db")
    ap.add_argument("--n", type=int, default=20000)
    a = ap.parse_args()
    torch.set_num_threads(1)
    db = a.db
    if db is None:
        from _matcher_fixture import cached_db

        db = cached_db(os.path.join(tempfile.mkdtemp(), "fp.duckdb"))
    from optwin.fingerprints.matcher import Matcher
    from optwin.ingest import sketch

    t0 = time.perf_counter()
    m = Matcher.open(db)
    print(f"Matcher.open: {1e3 * (time.perf_counter() - t0):.1f} ms, build {m.build_id}, "
          f"{sum(len(t.probs) for t in m.index.values())} regions in {len(m.index)} triples")
    rnd = random.Random(0)
    tr = ("rmsnorm", "native-dtype", "float16")
    sks = []
    for _ in range(a.n):
        am = 2 ** rnd.uniform(-2, 11)
        sks.append({"numel": 256.0, "rows": 4.0, "absmax": am, "rms": am / 3, "nonfinite": 0.0, "hidden": 64.0,
                    "max_row_rms": am / 2.5, "weight_absmax": 1.0})
    for s in sks[:2000]:
        m.assess(*tr, sketch=s)  # warm the unknown-region cache like a running service
    print(row("assess(sketch=...)  [rmsnorm, 13 octaves]", timeit(lambda s: m.assess(*tr, sketch=s), sks)))
    fixed = [sks[0]] * a.n
    print(row("assess(sketch=...)  [same region]", timeit(lambda s: m.assess(*tr, sketch=s), fixed)))
    s = m.stream("bench", *tr)
    it = iter(range(10**9))
    print(row("stream.observe(sketch=...)", timeit(lambda sk: s.observe(sketch=sk, t=0.01 * next(it)), sks)))
    g = torch.Generator().manual_seed(0)
    for shape in ((4, 64), (64, 4096)):
        xs = [{"x": (torch.randn(*shape, generator=g) * 2 ** rnd.uniform(-2, 10)).half(),
               "weight": torch.ones(shape[1], dtype=torch.float16)} for _ in range(200)]
        n = 2000 if shape[1] <= 64 else 300
        inputs = [xs[i % len(xs)] for i in range(n)]
        sk_us = timeit(lambda x: sketch("rmsnorm", x), inputs)
        full = timeit(lambda x: m.assess(*tr, inputs=x), inputs)
        print(row(f"sketch alone  x{shape} float16 (CPU)", sk_us))
        print(row(f"assess(inputs=...) x{shape} float16 (CPU)", full))


if __name__ == "__main__":
    main()
