"""Engines that run a build's shards: a local process pool or Ray tasks, same shard function.

    optwin build --engine ray --address auto

Both call `shards.run_shard(spec_dict, work_dir)` and report each finished shard's summary to a
callback (the progress bar). Workers use one torch thread each: a shard is one core's worth of work,
and parallelism comes from running shards side by side. With Ray on a multi-node cluster the work
directory must be on a filesystem every node sees (shard files are written by the workers).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterator, Sequence

from optwin.errors import OptwinError, first_line
from optwin.fingerprints.shards import ShardSpec, run_shard

OnDone = Callable[[dict[str, Any]], None]
ENGINES = ("local", "ray")


def _init_worker(parent: int) -> None:
    # Ctrl-C reaches the whole process group, workers included: the builder handles it (it kills its workers), so
    # a worker must not die of it with a traceback of its own. It was started with SIGINT blocked (_signals_held),
    # which covers its start-up imports, before this runs; from here it ignores SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
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


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back within the block and delivered when it ends (to the handlers of before). SIGINT
    is also blocked in the OS, so a process started within inherits it blocked: a pool worker cannot be interrupted
    before its initializer ignores SIGINT. (SIGTERM is not: the pool stops a broken pool's workers with it.) Outside
    the main thread nothing is held: Python delivers signals to the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {s: signal.signal(s, lambda n, _f: got.append(n)) for s in (signal.SIGINT, signal.SIGTERM)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, handler in old.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for n in dict.fromkeys(got):
            signal.raise_signal(n)


def _kill_pool(ex: ProcessPoolExecutor, procs: dict[int, Any]) -> None:
    """Stop the pool now: drop the queued shards and kill the workers mid-shard. A shard file is written under a
    temporary name and renamed, so a killed shard leaves no file and --resume runs it again. Waiting for the running
    shards instead (shutdown(wait=True), and the interpreter's exit handlers, which join the pool's manager thread
    and every child process) took minutes, and a second Ctrl-C during that wait left the builder hung in them.
    Futures are cancelled by shutdown(cancel_futures=True), which also takes them off the pool's books: cancelled
    by hand, the pool's manager thread later failed them as broken and died of InvalidStateError (a traceback)."""
    manager = getattr(ex, "_executor_manager_thread", None)  # shutdown() forgets it: joined below
    live = list(procs.values())
    ex.shutdown(wait=False, cancel_futures=True)
    for p in live:
        with contextlib.suppress(Exception):  # already gone
            p.kill()
    deadline = time.monotonic() + 10.0
    for p in live:  # reaped here, so multiprocessing's exit handler has none left to wait for
        p.join(max(0.0, deadline - time.monotonic()))
    if manager is not None:  # its workers dead, it fails their shards and ends: concurrent.futures' exit handler joins it
        manager.join(max(0.0, deadline - time.monotonic()))


def _stop_pool(ex: ProcessPoolExecutor, procs: dict[int, Any]) -> None:
    """_kill_pool with SIGINT/SIGTERM held, so a second Ctrl-C cannot leave it half done; one that lands before the
    hold is in place starts it again. A signal held during the kill is delivered once the workers are gone."""
    done = False
    while not done:
        try:
            with _signals_held():
                _kill_pool(ex, procs)
                done = True
        except KeyboardInterrupt:
            if done:
                raise


def _worker_death(procs: dict[int, Any]) -> str:
    """What killed the pool, from its workers' exit codes when it broke: the pool then sends SIGTERM to the others,
    so a worker gone some other way is the one that died first. A dead worker's exitcode reads None for a moment
    while the pool's manager thread reaps it (its waitpid takes the status), so it is looked at again briefly."""
    deadline = time.monotonic() + 2.0
    while True:
        codes = {pid: p.exitcode for pid, p in list(procs.items())}
        if any(c is not None for c in codes.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    dead = sorted(((c == -signal.SIGTERM, pid, c) for pid, c in codes.items() if c is not None))
    if not dead:
        return "a build worker died"
    _, pid, code = dead[0]
    if code == -signal.SIGKILL:
        return f"a build worker (pid {pid}) was killed by SIGKILL, most likely by the out-of-memory killer (fewer --workers use less memory)"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"a build worker (pid {pid}) was killed by {signal.Signals(-code).name}"
    return f"a build worker (pid {pid}) died (exit code {code})"


def run_local(specs: Sequence[ShardSpec], work_dir: str, workers: int, on_done: OnDone) -> None:
    """Run shards on a spawn-context process pool of `workers` processes (fork is unsafe with torch threads).
    Interrupted (KeyboardInterrupt, or any error), the workers are killed, not waited for; a worker that dies (the
    OOM killer, kill -9) is one OptwinError line. Either way the finished shards stay for --resume."""
    if not specs:
        return
    ctx = multiprocessing.get_context("spawn")
    ex = ProcessPoolExecutor(max_workers=max(1, min(workers, len(specs))), mp_context=ctx,
                             initializer=_init_worker, initargs=(os.getpid(),))
    # The pool's own {pid: Process} (it starts them in submit): no public API names the workers, and they must be
    # killed, not waited for, when the build stops.
    procs: dict[int, Any] = ex._processes
    try:
        # held: a Ctrl-C raised inside submit could fall between a worker's start and its entry in procs (and
        # leave it running); and the workers it starts inherit SIGINT blocked
        with _signals_held():
            pending = {ex.submit(run_shard, s.to_dict(), work_dir) for s in specs}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                on_done(f.result())
    except BrokenProcessPool:
        death = _worker_death(procs)
        _stop_pool(ex, procs)
        raise OptwinError(f"{death}: finished shards stay in {work_dir}, and the same command with --resume "
                          "continues from them") from None
    except BaseException:
        _stop_pool(ex, procs)
        raise
    ex.shutdown(wait=True)


def _package_root() -> str:
    import optwin

    return os.path.dirname(os.path.dirname(os.path.abspath(optwin.__file__)))


# Seconds an --address may take to accept a connection (OPTWIN_RAY_CONNECT_TIMEOUT_S overrides it).
RAY_CONNECT_TIMEOUT_S = 20.0


def _ray_connect_timeout() -> float:
    value = os.environ.get("OPTWIN_RAY_CONNECT_TIMEOUT_S", "").strip()
    try:
        timeout_s = float(value) if value else RAY_CONNECT_TIMEOUT_S
    except ValueError:
        timeout_s = float("nan")
    if not 0 < timeout_s < float("inf"):
        raise OptwinError(f"OPTWIN_RAY_CONNECT_TIMEOUT_S={value!r}: expected a positive number of seconds")
    return timeout_s


def _probe_ray_address(address: str, timeout_s: float) -> None:
    """Refuse an --address that nothing answers at, within timeout_s. ray.init retries an unreachable cluster for
    minutes (20 attempts, each waiting out gRPC's connect and cluster-id timeouts), printing only warnings, and
    its own timeouts are read from the environment when ray is imported: so a TCP connect first, to the address
    Ray will use (it turns 127.0.0.1 and localhost into this node's IP). "auto" and "local" are left to ray.init,
    which settles them at once."""
    if address in ("auto", "local"):
        return
    target = address.removeprefix("ray://")
    if target == address:
        with contextlib.suppress(Exception):  # a Ray without it, or a host it cannot resolve: probe it as given
            from ray._private.services import canonicalize_bootstrap_address

            target = canonicalize_bootstrap_address(address) or address
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise OptwinError(f"--address {address}: expected host:port, ray://host:port, auto or local")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        why = f"no answer in {timeout_s:g} s (OPTWIN_RAY_CONNECT_TIMEOUT_S sets the wait)" if isinstance(e, TimeoutError) \
            else (e.strerror or str(e) or type(e).__name__)
        seen = f" ({target})" if target != address else ""
        raise OptwinError(f"cannot reach the Ray cluster at --address {address}{seen}: {why}") from None


def check_ray_address(address: str) -> None:
    """Refuse an unreachable --address (or a bad OPTWIN_RAY_CONNECT_TIMEOUT_S) with one OptwinError line, within
    OPTWIN_RAY_CONNECT_TIMEOUT_S (default 20 s). build's check_inputs calls it, before the lock and the work
    directory: run from run_ray, a bad address left <out>.work/manifest.json behind."""
    _probe_ray_address(address, _ray_connect_timeout())


def run_ray(specs: Sequence[ShardSpec], work_dir: str, workers: int, on_done: OnDone,
            address: str | None = None) -> None:
    """Run shards as Ray tasks: on the cluster at `address` (checked first by check_ray_address), or a local one
    with num_cpus=workers."""
    import ray

    started = False
    if not ray.is_initialized():
        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [_package_root(), os.environ.get("PYTHONPATH")])),
                            "OMP_NUM_THREADS": "1"}}
        if address:
            try:
                ray.init(address=address, runtime_env=env, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:  # no cluster for "auto", a port that is no Ray
                with contextlib.suppress(Exception):
                    ray.shutdown()
                first = first_line(e)
                raise OptwinError(f"cannot connect to the Ray cluster at --address {address}: {first}") from None
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
        raise OptwinError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")
