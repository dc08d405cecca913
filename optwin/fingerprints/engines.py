"""Engines that run a build's shards: a local process pool or Ray tasks, same shard function.

    optwin build --engine ray --address auto

Both call `shards.run_shard(spec_dict, work_dir)` and report each finished shard's summary to a
callback (the progress bar). Workers use one torch thread each: a shard is one core's worth of work,
and parallelism comes from running shards side by side. With Ray on a multi-node cluster the work
directory must be on a filesystem every node sees (shard files are written by the workers).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Sequence

from optwin.fingerprints.shards import ShardSpec, run_shard

OnDone = Callable[[dict[str, Any]], None]
ENGINES = ("local", "ray")


def _init_worker(parent: int) -> None:
    import threading

    import torch

    torch.set_num_threads(1)
    threading.Thread(target=_exit_with_parent, args=(parent,), name="optwin-parent-watch", daemon=True).start()


def _exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """A pool worker outlives a builder killed with SIGKILL (no shutdown reaches it) and would go on writing
    shards for nobody: once its parent is gone (it is re-parented), it exits."""
    import time

    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


def run_local(specs: Sequence[ShardSpec], work_dir: str, workers: int, on_done: OnDone) -> None:
    """Run shards on a spawn-context process pool of `workers` processes (fork is unsafe with torch threads)."""
    if not specs:
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, min(workers, len(specs))), mp_context=ctx,
                             initializer=_init_worker, initargs=(os.getpid(),)) as ex:
        pending = {ex.submit(run_shard, s.to_dict(), work_dir) for s in specs}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    on_done(f.result())
        except BaseException:
            for f in pending:
                f.cancel()
            raise


def _package_root() -> str:
    import optwin

    return os.path.dirname(os.path.dirname(os.path.abspath(optwin.__file__)))


def run_ray(specs: Sequence[ShardSpec], work_dir: str, workers: int, on_done: OnDone,
            address: str | None = None) -> None:
    """Run shards as Ray tasks: on the cluster at `address`, or a local one with num_cpus=workers."""
    import ray

    started = False
    if not ray.is_initialized():
        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [_package_root(), os.environ.get("PYTHONPATH")])),
                            "OMP_NUM_THREADS": "1"}}
        if address:
            ray.init(address=address, runtime_env=env, log_to_driver=False)
        else:
            ray.init(num_cpus=max(1, workers), include_dashboard=False, runtime_env=env, log_to_driver=False)
        started = True
    try:
        task = ray.remote(num_cpus=1, max_retries=1)(run_shard)
        pending = [task.remote(s.to_dict(), work_dir) for s in specs]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    on_done(ray.get(ref))
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
    finally:
        if started:
            ray.shutdown()


def run_shards(engine: str, specs: Sequence[ShardSpec], work_dir: str, workers: int, on_done: OnDone,
               address: str | None = None) -> None:
    if engine == "local":
        run_local(specs, work_dir, workers, on_done)
    elif engine == "ray":
        run_ray(specs, work_dir, workers, on_done, address)
    else:
        from optwin.errors import OptwinError

        raise OptwinError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
