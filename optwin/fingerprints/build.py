"""Fingerprint builds: plan shards, run them (local pool or Ray), gather into DuckDB, swap atomically.

    optwin build --quick --out fingerprints.duckdb

Steps, each safe to kill:
1. plan: every (op, variant, dtype) of the catalog (or `--ops`) x case source x slice becomes a
   shard; the plan and the build id go to `<out>.work/manifest.json`;
2. run: shards write `<out>.work/shards/<shard>.parquet` (tmp name + os.replace); `--resume` reuses
   the manifest and skips every shard whose file exists, so nothing is redone or duplicated;
3. gather: the existing database (if any) is copied to `<out>.tmp-<uuid>`, the shard files are read
   into it (deduplicated by shard and case id), fingerprints and representatives are aggregated in
   SQL, and the file is os.replace()d onto `<out>`: readers never see a half-written database;
4. the work directory is removed.
Case counts and replays come from a preset (`quick`: demos and tests; `full`: the default build).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from optwin.catalog import all_triples, operator, resolve_tolerances
from optwin.errors import DatabaseError, OptwinError, ProfileError
from optwin.writable import check_writable_in
from optwin.fingerprints.build_lock import build_lock
from optwin.fingerprints.shards import ShardSpec, _write_atomic, shard_done, shard_path, stable_hash, summary_path

MANIFEST_VERSION = 1
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # builds.seed is a BIGINT


@dataclass(frozen=True)
class Preset:
    """Sizes of a build: cases per generator call (per op and dtype, shared by its variants)."""

    name: str
    cases: int  # per (op, dtype, source) generator call
    replays: int  # noisy replays per case
    slices: int  # shards per (op, variant, dtype, source): load balance and resume granularity


PRESETS: dict[str, Preset] = {
    # Cases over replays: held-out inputs are judged by where they land in feature space, so the
    # cells need many distinct cases more than many noisy replays of each (the fault flags of one
    # input rarely depend on the replay). Measured on a quiet 2-core machine, all 47 triples:
    # quick (192 x 4) 47 s wall, full (384 x 8) 128 s wall. 768 x 8 took ~1.7x as long as
    # 384 x 8 in an earlier measurement and predicted no better on CPU-labelled held-out cases.
    "quick": Preset("quick", cases=192, replays=4, slices=1),
    "full": Preset("full", cases=384, replays=8, slices=2),
}

# Relative cost of one case per op (measured replay time): the pool starts the dearest shards first.
_COST = {"layernorm": 2.5, "attention": 1.5, "rmsnorm": 1.1, "softmax": 1.0, "rope": 1.0, "matmul": 0.3, "geodesic": 0.1}


@dataclass
class BuildConfig:
    out: str = "fingerprints.duckdb"
    profile: str | None = None
    ops: tuple[str, ...] | None = None  # None: every catalog operator
    replays: int | None = None  # None: the preset's
    cases: int | None = None  # None: the preset's
    noise: str = "stochastic"
    engine: str = "local"
    address: str | None = None
    quick: bool = False
    resume: bool = False
    seed: int = 0
    workers: int | None = None  # None: os.cpu_count()
    tolerances: dict[str, float] = field(default_factory=dict)  # Tolerances overrides
    include_triton: bool = True

    @property
    def preset(self) -> Preset:
        return PRESETS["quick" if self.quick else "full"]

    @property
    def n_replays(self) -> int:
        return self.preset.replays if self.replays is None else self.replays

    @property
    def n_cases(self) -> int:
        return self.preset.cases if self.cases is None else self.cases

    @property
    def n_workers(self) -> int:
        return (os.cpu_count() or 1) if self.workers is None else self.workers

    @property
    def work_dir(self) -> str:
        return f"{self.out}.work"

    def plan_key(self) -> dict[str, Any]:
        """What determines the build's rows (engine, address and workers do not): the options (ops as a set:
        their order changes nothing), the profile's path and a hash of its files' bytes (a profile captured again
        under the same path is another input), the twin version (bumped whenever the twins' numerics change:
        shards of older twins must not be gathered under this one's version), and each op's region grid (features,
        binning, derived features): shards key their rows by region, so a build resumed across a grid change
        gathered 3- and 4-bin regions of one op, and the matcher refused the new database. Not the git revision:
        any commit, a README's included, would then throw away a killed build's shards."""
        from optwin.fingerprints.regions import grid
        from optwin.twin import TWIN_VERSION

        return {"ops": sorted(set(self.selected_ops())), "replays": self.n_replays, "cases": self.n_cases,
                "slices": self.preset.slices, "noise": self.noise, "seed": self.seed, "quick": self.quick,
                "profile": os.path.abspath(self.profile) if self.profile else None,
                "profile_digest": profile_digest(self.profile) if self.profile else None,
                "twin_version": TWIN_VERSION,
                "region_grid": {op: grid(op) for op in sorted(set(self.selected_ops()))},
                "tolerances": self.tolerance_values(), "include_triton": self.include_triton}

    def tolerance_values(self) -> dict[str, float]:
        return dataclasses.asdict(resolve_tolerances(self.tolerances))

    def selected_ops(self) -> tuple[str, ...]:
        from optwin.catalog import CATALOG

        return tuple(self.ops) if self.ops is not None else tuple(CATALOG)


@dataclass
class BuildResult:
    build_id: str
    out: str
    cases: int
    replays: int
    fingerprints: int
    shards_run: int
    shards_skipped: int
    duration_s: float
    summary: list[dict[str, Any]]  # per (op, variant, dtype): cases, replays, rejected, fault rates
    run_s: float = 0.0  # running the shards (this invocation)
    gather_s: float = 0.0  # gather + aggregate + commit into the database
    already_done: bool = False  # --resume of a build that had reached the database (killed while cleaning up)


def profile_digest(path: str) -> str:
    """blake2b over a profile's files (a directory: every file below it, by sorted relative name): names, sizes
    and bytes, read in 1 MiB blocks (a profile's tensors can be large)."""
    root = os.path.abspath(path)
    if os.path.isdir(root):
        files = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    else:
        files, root = [os.path.basename(root)], os.path.dirname(root)
    h = hashlib.blake2b(digest_size=16)
    try:
        for rel in files:
            full = os.path.join(root, rel)
            h.update(f"{rel}\0{os.path.getsize(full)}\0".encode())
            with open(full, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    except OSError as e:
        raise ProfileError(f"{path}: cannot read the profile ({e.strerror or e})") from None
    return h.hexdigest()


_PLAN_NAMES = {"profile_digest": "the profile's files", "twin_version": "the twin version",
               "region_grid": "the region grid"}


def _plan_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What differs between a work dir's plan and this build's, for the one-line refusal."""
    parts = []
    for k in sorted(set(old) | set(new), key=lambda k: (k not in _PLAN_NAMES, k)):
        if old.get(k) != new.get(k):
            what = _PLAN_NAMES.get(k, k)
            if k == "region_grid" and isinstance(old.get(k), dict):  # name the ops whose grid changed
                ops = sorted(op for op in set(old[k]) | set(new.get(k) or {}) if old[k].get(op) != (new.get(k) or {}).get(op))
                what = f"{what} of {', '.join(ops)}"
            parts.append(f"{what} ({old.get(k)} -> {new.get(k)})" if k.endswith("_version") else what)
    return ", ".join(parts)


def validate_config(cfg: BuildConfig) -> None:
    """Bad input becomes one OptwinError line before any work starts."""
    from optwin.fingerprints.engines import ENGINES
    from optwin.twin import NOISE_MODES

    if cfg.ops is not None and not cfg.ops:
        from optwin.catalog import CATALOG

        raise OptwinError(f"--ops names no operator: give some of {', '.join(CATALOG)}, or leave --ops out for all")
    for op in cfg.selected_ops():
        operator(op)  # CatalogError naming the known operators
    if cfg.noise not in NOISE_MODES:
        raise OptwinError(f"unknown noise mode {cfg.noise!r}; expected one of {', '.join(NOISE_MODES)}")
    if cfg.engine not in ENGINES:
        raise OptwinError(f"unknown engine {cfg.engine!r}; expected one of {', '.join(ENGINES)}")
    if cfg.n_replays < 0 or cfg.n_cases < 1 or cfg.n_workers < 1:
        raise OptwinError("--replays must be >= 0, --cases and --workers >= 1")
    if not SEED_MIN <= cfg.seed <= SEED_MAX:  # else every shard ran, then the gather failed on the BIGINT column
        raise OptwinError(f"--seed {cfg.seed} is out of range: the database stores it as a 64-bit integer "
                          f"({SEED_MIN} to {SEED_MAX})")
    resolve_tolerances(cfg.tolerances)  # unknown fields and bad values: one CatalogError line, as twin.run's
    if cfg.profile is not None:
        from optwin.fingerprints.sources import check_profile_sketches, profile_ops

        try:
            check_profile_sketches(cfg.profile, profile_ops(cfg.profile) & set(cfg.selected_ops()))
        except OptwinError:
            raise
        except Exception as e:  # a truncated/corrupt file surfaces as whatever its reader raises
            raise ProfileError(f"{cfg.profile}: unreadable profile ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def plan_shards(cfg: BuildConfig) -> list[ShardSpec]:
    """Every shard of the build, dearest first."""
    ops = set(cfg.selected_ops())
    prof_ops: set[str] = set()
    if cfg.profile is not None:
        from optwin.fingerprints.sources import profile_ops

        prof_ops = profile_ops(cfg.profile)
    profile = os.path.abspath(cfg.profile) if cfg.profile else None
    specs = []
    for op, variant, dtype in all_triples(cfg.include_triton):
        if op not in ops:
            continue
        sources = ("profile-tensor", "profile-sample", "sweep") if op in prof_ops else ("default", "sweep")
        for source in sources:
            gen_seed = stable_hash("gen", cfg.seed, op, dtype, source) % (2**31)
            for s in range(cfg.preset.slices):
                specs.append(ShardSpec(op, variant, dtype, source, s, cfg.preset.slices, cfg.n_cases, gen_seed,
                                       cfg.n_replays, cfg.noise, cfg.seed, profile if source.startswith("profile") else None,
                                       dict(cfg.tolerances)))
    specs.sort(key=lambda s: -_COST.get(s.op, 1.0))
    return specs


def _write_json(path: str, obj: Any) -> None:
    # The shards' one durable writer: the manifest needs the same fsync, or a power loss can leave it empty and the
    # next --resume, finding it unreadable, deletes the fsynced shards with the work directory.
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)

    _write_atomic(path, write)


def load_or_write_manifest(cfg: BuildConfig, specs: list[ShardSpec],
                           on_note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The manifest of this build: reused on --resume when it plans the same build, else fresh. A --resume
    that finds no interrupted build starts a fresh one and says so through on_note."""
    path = os.path.join(cfg.work_dir, "manifest.json")
    key = cfg.plan_key()
    if cfg.resume and not os.path.exists(path) and on_note:
        on_note(f"--resume: no interrupted build in {cfg.work_dir}; starting a fresh build")
    if os.path.exists(path):
        if cfg.resume:
            manifest = _read_manifest(cfg.work_dir)
            if (not manifest or manifest.get("version") != MANIFEST_VERSION) and on_note:
                on_note(f"--resume: {path} is unreadable or of another optwin; starting a fresh build")
            if manifest and manifest.get("version") == MANIFEST_VERSION:
                if manifest.get("plan") != key:
                    changed = _plan_changes(manifest.get("plan") or {}, key)
                    raise OptwinError(f"{cfg.work_dir} holds a different build ({changed} differ from when it started): "
                                      "its shards cannot be reused; rerun with the same options, or without --resume "
                                      "to start over")
                return manifest
    if os.path.exists(cfg.work_dir):  # not resuming, or nothing resumable: start over, no stale shards
        if not cfg.resume and on_note:
            note = _discard_note(cfg, key)
            if note:
                on_note(note)
        shutil.rmtree(cfg.work_dir)
    os.makedirs(os.path.join(cfg.work_dir, "shards"), exist_ok=True)
    manifest = {"version": MANIFEST_VERSION, "build_id": f"b{dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:8]}",
                "created_at": dt.datetime.now(dt.timezone.utc).replace(tzinfo=None).isoformat(),
                "plan": key, "shards": [s.shard_id for s in specs]}
    _write_json(path, manifest)
    return manifest


def _discard_note(cfg: BuildConfig, key: dict[str, Any]) -> str | None:
    """The line said when a build without --resume is about to delete an interrupted build's finished shards (an
    hour of work, maybe): how many, and whether --resume would have kept them (the same plan) or not. None when
    there are none, or when that build already reached the database (killed while removing its work directory)."""
    folder = os.path.join(cfg.work_dir, "shards")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    n = sum(1 for name in names if name.endswith(".parquet"))
    if not n or landed_build(cfg) is not None:
        return None
    manifest = _read_manifest(cfg.work_dir) or {}
    if manifest.get("version") == MANIFEST_VERSION and manifest.get("plan") == key:
        return f"discarding {n} finished shard(s) of an interrupted build in {cfg.work_dir}: --resume would have kept them"
    return f"discarding {n} finished shard(s) of an interrupted build with other options in {cfg.work_dir}"


def _read_manifest(work_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(work_dir, "manifest.json")) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _saved_build(out: str, build_id: str) -> dict[str, Any] | None:
    """The `builds` row of build_id in the database at `out`, if it is there."""
    from optwin.fingerprints.store import open_store

    if not os.path.exists(out):
        return None
    with open_store(out, read_only=True) as store:
        return next((b for b in store.builds() if b["build_id"] == build_id), None)


def landed_build(cfg: BuildConfig) -> str | None:
    """The id of the build in cfg.work_dir if it already reached cfg.out (the swap happened, the cleanup did not
    finish), else None. Never raises: it is asked after an interrupt, to tell the truth about the database."""
    try:
        manifest = _read_manifest(cfg.work_dir)
        bid = manifest.get("build_id") if manifest else None
        return bid if bid and _saved_build(cfg.out, bid) is not None else None
    except Exception:  # noqa: BLE001  an unreadable database: then it did not land
        return None


def _shards_to_run(work_dir: str, specs: list[ShardSpec], on_note: Callable[[str], None] | None) -> list[ShardSpec]:
    """The shards of `specs` without a finished, readable file pair in work_dir. A damaged pair (a zero-length or
    cut file, as a crash can leave on a filesystem that lost unsynced data) is removed and run again, said in one
    line: kept, it failed the gather, or the summary read, on every --resume."""
    todo, damaged = [], []
    for s in specs:
        if os.path.lexists(shard_path(work_dir, s.shard_id)) and not shard_done(work_dir, s.shard_id):
            damaged.append(s.shard_id)
            for p in (shard_path(work_dir, s.shard_id), summary_path(work_dir, s.shard_id)):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(p)
        if not os.path.lexists(shard_path(work_dir, s.shard_id)):
            todo.append(s)
    if damaged and on_note:
        names = ", ".join(damaged[:3]) + (f" and {len(damaged) - 3} more" if len(damaged) > 3 else "")
        on_note(f"--resume: {len(damaged)} finished shard(s) in {work_dir} have unreadable files and run again: {names}")
    return todo


def _remove_work_dir(work_dir: str) -> None:
    """Remove the work directory, its manifest last: a kill midway leaves a manifest that --resume recognises as a
    build already in the database (and finishes removing), never a partial shard set without one."""
    manifest = os.path.join(work_dir, "manifest.json")
    for name in sorted(os.listdir(work_dir)) if os.path.isdir(work_dir) else []:
        p = os.path.join(work_dir, name)
        if p == manifest:
            continue
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(p)
    shutil.rmtree(work_dir, ignore_errors=True)


def code_version() -> str:
    import optwin

    root = os.path.dirname(os.path.dirname(os.path.abspath(optwin.__file__)))
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"{optwin.__version__}+{rev}" if rev else optwin.__version__


def _summarise(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    table: dict[tuple[str, str, str], dict[str, Any]] = {}
    for s in summaries:
        row = table.setdefault((s["op"], s["variant"], s["dtype"]),
                               {"op": s["op"], "variant": s["variant"], "dtype": s["dtype"], "cases": 0, "replays": 0,
                                "rejected": 0, "faults": {f: 0 for f in operator(s["op"]).fault_types}})
        row["cases"] += s["cases"]
        row["replays"] += s["replays"]
        row["rejected"] += sum(s["rejected"].values())
        for f in row["faults"]:
            row["faults"][f] += s["faults"].get(f, 0)
    out = []
    for row in table.values():
        # the trials actually run: the replays, or with --replays 0 each case's deterministic run (its flag counts once)
        trials = row["replays"] if row["replays"] > 0 else row["cases"]
        row["rates"] = {f: (k / trials if trials else 0.0) for f, k in row["faults"].items()}
        out.append(row)
    return sorted(out, key=lambda r: (r["op"], r["variant"], r["dtype"]))


def check_out(out: str) -> None:
    """A --out the build can write: a file name in an existing writable directory, and not a directory or
    read-only file itself. The build writes `<out>.lock`, `<out>.work/` and a copy beside it, so this is refused up
    front, not after all the work. A missing directory is refused, not made: a mistyped path used to get its
    directories created and a whole build run into them, where validate --json, serve's unix socket and
    --warnings-jsonl all refuse one."""
    if not out.strip():
        raise OptwinError("--out is empty: name the database file to write")
    path = os.path.realpath(out)  # a symlink's target is what the build writes, in the target's directory
    if os.path.isdir(path):
        raise OptwinError(f"--out {out} is a directory: name the database file to write")
    parent = os.path.dirname(path)
    check_writable_in("--out", out, parent)  # first: a file or an unwritable directory above names itself
    if not os.path.isdir(parent):
        raise OptwinError(f"--out {out}: directory {parent} does not exist (create it first)")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise OptwinError(f"--out {out}: the file is not writable")


def check_inputs(cfg: BuildConfig) -> None:
    """Everything that can be refused before work starts: options, profile, --out, the target's schema version, a
    Ray --address that nothing answers at."""
    from optwin.fingerprints.store import open_store

    validate_config(cfg)
    check_out(cfg.out)
    if os.path.exists(cfg.out):
        open_store(cfg.out, read_only=True).close()
    if cfg.engine == "ray" and cfg.address:
        from optwin.fingerprints.engines import check_ray_address

        check_ray_address(cfg.address)


def build(cfg: BuildConfig, on_start: Callable[[int, int], None] | None = None,
          on_shard: Callable[[dict[str, Any]], None] | None = None,
          on_note: Callable[[str], None] | None = None, *, checked: bool = False) -> BuildResult:
    """Run a whole build (see the module docstring). Callbacks feed the progress display:
    on_start(total_shards, already_done), on_shard(summary), on_note(line): what the build did unasked (a
    --resume with nothing to resume, an interrupted build's shards discarded, damaged shards run again, copies
    left by killed builds removed).
    checked: the caller has just run check_inputs(cfg) itself (`optwin build`, to print its error before the
    progress display), so it is not run again: it reads the profile's sketches, which is not free."""
    t0 = time.perf_counter()
    if not checked:
        check_inputs(cfg)  # fail fast: bad options, profile, or a database of another schema version
    # Resolved once, here: a symlinked --out names its target, and the lock, the copy (in the target's directory)
    # and the swap must all act on that one file. On the link itself, the swap turned the link into a plain file
    # (the target kept the old data) and a build through the target's own path took another lock.
    db = os.path.realpath(cfg.out)  # its directory exists: check_out refuses a missing one
    with build_lock(db):
        return _build_locked(cfg, t0, on_start, on_shard, on_note, db=db)


def _build_locked(cfg: BuildConfig, t0: float, on_start: Callable[[int, int], None] | None,
                  on_shard: Callable[[dict[str, Any]], None] | None,
                  on_note: Callable[[str], None] | None = None, *, db: str) -> BuildResult:
    """build's steps, with the database's build lock held; `db` is cfg.out resolved (os.path.realpath)."""
    from optwin.fingerprints.duckdb_store import (copy_for_write, fold_wal, is_disk_full, is_interrupt, remove_db_files,
                                                  remove_stale_copies, swap_in, temp_path)
    from optwin.fingerprints.engines import run_shards
    from optwin.fingerprints.store import open_store
    from optwin.twin import TWIN_VERSION

    specs = plan_shards(cfg)
    tmp = temp_path(db)
    try:
        remove_stale_copies(db, on_note, shown_as=cfg.out)  # under the lock: no live build owns them
        fold_wal(db)  # a WAL a dead writer left: refused now if it cannot be folded in, not after the shards ran
        manifest = load_or_write_manifest(cfg, specs, on_note)
        saved = _saved_build(db, manifest["build_id"]) if cfg.resume else None
        if saved is not None:  # killed after the swap, before the cleanup: the build is done
            with open_store(db, read_only=True) as store:
                n_fp = len(store.fingerprints(manifest["build_id"]))
            _remove_work_dir(cfg.work_dir)
            return BuildResult(manifest["build_id"], cfg.out, int(saved["n_cases"] or 0), int(saved["n_replays"] or 0),
                               n_fp, 0, len(specs), time.perf_counter() - t0, [], already_done=True)
        todo = _shards_to_run(cfg.work_dir, specs, on_note)
        if on_start:
            on_start(len(specs), len(specs) - len(todo))
        t_run = time.perf_counter()
        run_shards(cfg.engine, todo, cfg.work_dir, cfg.n_workers, on_shard or (lambda s: None), cfg.address)
        run_s = time.perf_counter() - t_run
        summaries = []
        for s in specs:
            with open(summary_path(cfg.work_dir, s.shard_id)) as f:
                summaries.append(json.load(f))
        if os.path.exists(db):
            copy_for_write(db, tmp)
        flags = {"ops": list(cfg.selected_ops()), "replays": cfg.n_replays, "cases": cfg.n_cases, "noise": cfg.noise,
                 "quick": cfg.quick, "engine": cfg.engine, "workers": cfg.n_workers, "slices": cfg.preset.slices,
                 "tolerances": cfg.tolerance_values(), "include_triton": cfg.include_triton}
        row = {"build_id": manifest["build_id"], "created_at": dt.datetime.fromisoformat(manifest["created_at"]),
               "code_version": code_version(), "twin_version": TWIN_VERSION, "seed": cfg.seed,
               "flags": json.dumps(flags, sort_keys=True), "profile": manifest["plan"]["profile"],
               "replays": cfg.n_replays, "noise": cfg.noise, "engine": cfg.engine,
               "duration_s": time.perf_counter() - t0}
        store = open_store(tmp, read_only=False, create=True)
        try:
            counts = store.add_build(row, [shard_path(cfg.work_dir, s.shard_id) for s in specs])
            store.checkpoint()
        finally:
            store.close()
        swap_in(tmp, db)
        _remove_work_dir(cfg.work_dir)
    except DatabaseError as e:  # name the target, not our private temporary copy
        raise DatabaseError(str(e).replace(tmp, cfg.out)) from None
    except OptwinError:
        raise
    except Exception as e:
        if is_interrupt(e):  # Ctrl-C/SIGTERM while DuckDB ran a query: RuntimeError("Query interrupted")
            raise KeyboardInterrupt from None
        if is_disk_full(e):
            raise DatabaseError(f"{cfg.out}: disk full while building: free space and rerun with --resume "
                                "(finished shards are kept)") from None
        raise
    finally:
        remove_db_files(tmp)
    return BuildResult(manifest["build_id"], cfg.out, int(counts["cases"]), int(counts["replays"]), int(counts["fingerprints"]),
                       len(todo), len(specs) - len(todo), time.perf_counter() - t0, _summarise(summaries), run_s,
                       counts["gather_s"] + counts["aggregate_s"] + counts["commit_s"])
