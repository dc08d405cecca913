"""Sidecar throughput and latency: several client processes on loopback against `optwin serve`.

    python bench/bench_sidecar.py [--db fingerprints.duckdb] [--clients 3] [--rates 5000,20000,60000] [--seconds 6]

The sidecar runs as its own process (python -m optwin.fingerprints.serve_cli). Each client process
runs the real SidecarClient (bounded queue, sender thread, batches) and produces records at its
share of the target rate, spread over 64 streams of drifting rmsnorm sketches. Per target rate:
sustained records/s answered, request latency p50/p99 (client round trip of one batch), and loss:
dropped (client queue full), rejected (503), failed (transport). Below saturation every record is
answered; above it the overflow is dropped and counted, never blocking the producers.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_proc(url: str, rate: float, seconds: float, idx: int, batch: int, out: mp.Queue) -> None:
    from optwin.fingerprints.client import SidecarClient

    c = SidecarClient(url, queue_size=20000, batch_size=batch, record_latency=True)
    base = {"numel": 256.0, "rows": 4.0, "rms": 1.0, "nonfinite": 0.0, "hidden": 64.0, "weight_absmax": 1.0}
    t0 = time.perf_counter()
    n = 0
    tick = 0.002  # produce in 2 ms slices at the target rate
    while True:
        now = time.perf_counter() - t0
        if now >= seconds:
            break
        due = int(rate * now)
        while n < due:
            am = 4.0 * (1.0 + 0.001 * (n % 1000))
            c.observe(f"c{idx}.s{n % 64}", "rmsnorm", "native-dtype", "float16",
                      dict(base, absmax=am, max_row_rms=am / 2), t=now)
            n += 1
        time.sleep(tick)
    produced_s = time.perf_counter() - t0
    c.flush(10)
    c.close(5)
    st = c.stats
    out.put({"produced": n, "seconds": produced_s, "sent": st.sent, "dropped": st.dropped, "rejected": st.rejected,
             "failed": st.failed, "lat": st.latencies_s})


def run(url: str, clients: int, rate: float, seconds: float, batch: int) -> dict:
    q: mp.Queue = mp.Queue()
    ps = [mp.Process(target=client_proc, args=(url, rate / clients, seconds, i, batch, q)) for i in range(clients)]
    for p in ps:
        p.start()
    res = [q.get(timeout=seconds + 60) for _ in ps]
    for p in ps:
        p.join()
    lat = sorted(x for r in res for x in r["lat"])
    tot = {k: sum(r[k] for r in res) for k in ("produced", "sent", "dropped", "rejected", "failed")}
    secs = max(r["seconds"] for r in res)
    return {"target": rate, **tot, "records_per_s": tot["sent"] / secs,
            "p50_ms": 1e3 * lat[len(lat) // 2] if lat else None, "p99_ms": 1e3 * lat[int(0.99 * len(lat))] if lat else None,
            "requests": len(lat)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--rates", default="5000,20000,60000")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--batch", type=int, default=128)
    a = ap.parse_args()
    db = a.db
    if db is None:
        from _matcher_fixture import cached_db

        db = cached_db(os.path.join(tempfile.mkdtemp(), "fp.duckdb"))
    url = f"tcp://127.0.0.1:{_free_port()}"
    server = subprocess.Popen([sys.executable, "-m", "optwin.fingerprints.serve_cli", "--db", db, "--listen", url,
                               "--log-level", "ERROR"], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    from optwin.fingerprints.client import HTTP

    try:
        for _ in range(600):
            try:
                if HTTP(url, timeout=1).request("GET", "/healthz")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        print(f"sidecar {url}, {a.clients} client processes, batch {a.batch}, {a.seconds:.0f} s per rate, "
              f"{os.cpu_count()} cores")
        print(f"{'target/s':>9} {'answered/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'produced':>9} {'sent':>9} "
              f"{'dropped':>8} {'503':>6} {'failed':>6}")
        rows = []
        for rate in (float(r) for r in a.rates.split(",")):
            r = run(url, a.clients, rate, a.seconds, a.batch)
            rows.append(r)
            print(f"{r['target']:9.0f} {r['records_per_s']:10.0f} {r['p50_ms']:7.2f} {r['p99_ms']:7.2f} "
                  f"{r['produced']:9d} {r['sent']:9d} {r['dropped']:8d} {r['rejected']:6d} {r['failed']:6d}")
        code, metrics = HTTP(url).request("GET", "/metrics")
        for line in metrics.decode().splitlines():
            if line.startswith(("optwin_sidecar_records_total", "optwin_sidecar_overloaded_total")):
                print("  " + line)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
