"""Input profiles on disk: write a capture, read it back, with one-line errors for bad files.

    python -c "from optwin.ingest import read_profile; p = read_profile('profiles/minilm'); print(p.summary())"

A profile is a directory:

* ``profile.json``: format tag and version, a random profile id, model, creation time, library
  versions, the capture's sampling settings, call and sample counts, skipped calls by reason.
* ``sketches.parquet`` (polars): one row per call: op, variant, dtype, stream, call_index (int64),
  t (float64 seconds since the capture began), params (JSON text) and one float64 column per
  sketch feature (the union over ops; null where a feature is not the op's).
* ``tensors.safetensors`` + ``tensors_index.json``: the reservoir-sampled raw inputs. The index
  lists each sample (op, variant, dtype, stream, call_index, shape_class, params) and the
  safetensors key of each of its inputs ("s<id>/<input name>"). No pickle anywhere.

Missing, truncated or corrupt files raise `ProfileError` with one line naming the file. profile.json
holds a sha256 of each data file (``checksums``), checked on read; profiles written before it had
them are read without that check.

Writes are whole: `write_profile` fills a hidden sibling directory (``.<name>.tmp-*``) and then
swaps it in for ``<name>`` in one rename (Linux renameat2 RENAME_EXCHANGE; elsewhere the old
directory is renamed aside first, so for an instant there is none). Two captures racing to the
same directory therefore never mix files: the last one to finish wins, whole, and the other's
profile is discarded. A reader that meets a swap mid-read (profile.json's id changed under it)
reads again; a `Profile` whose directory was replaced since it was read refuses to load samples
from the new one. An existing directory is replaced only when it holds profile files alone. A
write killed midway leaves its hidden directory; the next write of that profile removes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import math
import os
import platform
import shutil
import stat
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import torch

from optwin.catalog import CATALOG
from optwin.errors import ProfileError
from optwin.ingest.generate import Case
from optwin.ingest.sketch import SKETCH_FEATURES

if TYPE_CHECKING:
    import polars as pl

    from optwin.ingest.capture import Recorder

log = logging.getLogger("optwin.ingest.profile")

FORMAT = "optwin-profile"
FORMAT_VERSION = 1
META_FILE, SKETCH_FILE, TENSOR_FILE, INDEX_FILE = "profile.json", "sketches.parquet", "tensors.safetensors", "tensors_index.json"

# Every feature name of every op, in first-seen order: the feature columns of a sketch table.
ALL_FEATURES: tuple[str, ...] = tuple(dict.fromkeys(f for op in CATALOG for f in SKETCH_FEATURES[op]))
BASE_COLUMNS: tuple[str, ...] = ("op", "variant", "dtype", "stream", "call_index", "t", "params")


def sketch_frame(rows: Iterable[dict[str, Any]]) -> "pl.DataFrame":
    """Rows {op, variant, dtype, stream, call_index, t, params, sketch} -> the sketch table."""
    import polars as pl

    cols: dict[str, list[Any]] = {c: [] for c in BASE_COLUMNS + ALL_FEATURES}
    for r in rows:
        for c in ("op", "variant", "dtype", "stream"):
            cols[c].append(str(r.get(c, "")))
        cols["call_index"].append(int(r["call_index"]))
        t = r.get("t")
        cols["t"].append(float(t) if t is not None else None)
        cols["params"].append(json.dumps(r.get("params") or {}, sort_keys=True))
        sk = r["sketch"]
        for f in ALL_FEATURES:
            cols[f].append(sk.get(f))
    schema = {c: pl.Utf8 for c in ("op", "variant", "dtype", "stream", "params")}
    schema.update({"call_index": pl.Int64, "t": pl.Float64})
    schema.update({f: pl.Float64 for f in ALL_FEATURES})
    return pl.DataFrame(cols, schema=schema).select(list(BASE_COLUMNS + ALL_FEATURES))


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "polars", "safetensors"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001  versions are informational
            pass
    try:
        from importlib.metadata import version

        out["optwin"] = version("optwin")
    except Exception:  # noqa: BLE001
        out["optwin"] = "dev"
    return out


def write_profile(path: str | Path, rec: "Recorder", model: str = "", extra: dict[str, Any] | None = None) -> Path:
    """Write a Recorder's calls and samples as a profile directory, replacing an older profile there whole.

    The files go to a hidden sibling directory first, which is then swapped in (module docstring), so
    a reader or a second writer never sees a half-written or mixed profile."""
    out = Path(path)
    target = Path(os.path.realpath(out))  # a symlinked --out: replace the directory it names, not the link
    check_profile_target(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(target)
    # Same directory as the target: the final rename must not cross file systems.
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        os.mkdir(tmp)
    except OSError as e:
        raise ProfileError(f"{out}: cannot write beside it in {target.parent} ({e.strerror or e})") from None
    try:
        _write_files(tmp, rec, model, extra)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        _swap_in(tmp, target)
    except OSError as e:  # the capture is whole in tmp: keep it, it may have taken hours
        raise ProfileError(f"{out}: cannot rename the written profile into place ({e.strerror or e}); "
                           f"it is whole at {tmp}") from None
    return out


STALE_TMP_S = 3600.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # someone else's live process
    except (ProcessLookupError, OverflowError, ValueError):
        return False
    return True


def _remove_stale_tmp(target: Path) -> None:
    """Remove `.<name>.tmp-<pid>-*` directories a killed write left beside `target`: those without
    profile.json (written last, so never a whole profile) whose writer is gone from this machine's
    process table or that are over an hour old. A whole one (a failed rename's, named in its error) stays."""
    prefix = f".{target.name}.tmp-"
    try:
        entries = [e for e in os.scandir(target.parent) if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for e in entries:
        try:
            pid = int(e.name[len(prefix):].split("-", 1)[0])
            age = time.time() - e.stat(follow_symlinks=False).st_mtime
        except (ValueError, OSError):
            continue  # not a name this module makes
        if os.path.lexists(os.path.join(e.path, META_FILE)) or (_pid_alive(pid) and age < STALE_TMP_S):
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        log.warning("removed %s: an unfinished profile write (writer pid %d gone or %.0f s old)", e.path, pid, age)


DATA_FILES = (SKETCH_FILE, TENSOR_FILE, INDEX_FILE)
PROFILE_FILES = frozenset({META_FILE, SKETCH_FILE, TENSOR_FILE, INDEX_FILE, META_FILE + ".tmp"})


def check_profile_target(out: str | Path) -> None:
    """ProfileError unless `out` is absent, empty or a profile directory: writing replaces the whole
    directory, so one holding anything else (--out . by mistake) is refused, not deleted."""
    out = Path(out)
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise ProfileError(f"{out}: exists and is not a directory; a profile is a directory")
    try:
        foreign = sorted(e.name for e in os.scandir(out) if e.name not in PROFILE_FILES)
    except OSError as e:
        raise ProfileError(f"{out}: cannot list it ({e.strerror or e})") from None
    if foreign:
        raise ProfileError(f"{out}: holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''} besides "
                           "profile files; writing a profile replaces the directory: choose a new or empty one")
    # The new profile is written beside `out` and renamed over it: that needs a writable parent on the
    # same file system. A docker -v mount point fails both, and would fail after the capture ran.
    target = Path(os.path.realpath(out))
    try:
        if os.stat(target).st_dev != os.stat(target.parent).st_dev:
            raise ProfileError(f"{out}: a mount point; a profile is written beside its directory and renamed "
                               f"into place, which cannot cross file systems: use a directory inside it, e.g. {out / 'profile'}")
        # A probe, not os.access: that says yes to root on read-only mounts.
        os.rmdir(tempfile.mkdtemp(prefix=f".{target.name}.probe-", dir=target.parent))
    except OSError as e:
        raise ProfileError(f"{out}: cannot write beside it in {target.parent} ({e.strerror or e}); a profile is "
                           f"written there and renamed into place: use a directory inside it, e.g. {out / 'profile'}") from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_files(out: Path, rec: "Recorder", model: str, extra: dict[str, Any] | None) -> None:
    from safetensors.torch import save_file

    # Ties the files to each other: a reader checks it did not change mid-read, a Profile that its
    # tensors file is still the one it read.
    profile_id = uuid.uuid4().hex
    records = rec.records()
    sketch_frame(records).write_parquet(out / SKETCH_FILE)
    tensors: dict[str, torch.Tensor] = {}
    index: list[dict[str, Any]] = []
    for i, s in enumerate(rec.all_samples()):
        keys = {}
        for name, t in s.inputs.items():
            keys[name] = f"s{i}/{name}"
            tensors[keys[name]] = t
        index.append({"id": i, "op": s.op, "variant": s.variant, "dtype": s.dtype, "stream": s.stream,
                      "call_index": s.call_index, "shape_class": s.shape_class, "params": s.params, "tensors": keys})
    save_file(tensors, str(out / TENSOR_FILE), metadata={"format": FORMAT, "profile_id": profile_id})
    (out / INDEX_FILE).write_text(json.dumps({"version": FORMAT_VERSION, "profile_id": profile_id, "samples": index},
                                             indent=1))
    # safetensors writes the file 0600 whatever the umask: another user could read profile.json but not the
    # tensors it describes. Give it the mode open() gave the index (0666 less the umask), as every other file has.
    os.chmod(out / TENSOR_FILE, stat.S_IMODE(os.stat(out / INDEX_FILE).st_mode))
    st = rec.settings
    meta = {
        "format": FORMAT, "version": FORMAT_VERSION, "profile_id": profile_id, "model": model,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rec.started)),
        "versions": _versions(),
        "sampling": {"sample_rate": st.sample_rate, "capacity": st.capacity, "seed": st.seed,
                     "ops": list(st.ops) if st.ops is not None else None, "max_calls": st.max_calls},
        "n_calls": len(records), "n_samples": len(index), "skipped": dict(rec.skipped),
        **(extra or {}),
        # sha256 of each data file: a flipped bit in a float is still a valid parquet/safetensors file,
        # and only this tells the reader the values are not the ones captured.
        "checksums": {name: _sha256(out / name) for name in DATA_FILES},
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=1, default=str))


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux renameat2). False where the call or the file system
    lacks it, or `b` vanished meanwhile; the caller falls back to renaming."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOENT, errno.EPERM, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(tmp: Path, target: Path) -> None:
    """Put the finished directory `tmp` at `target`, replacing what is there; loops while another
    writer's rename gets in between (each pass either lands ours or sees theirs landed)."""
    while True:
        try:
            os.rename(tmp, target)  # target absent or an empty directory: done in one step
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if _exchange(tmp, target):
            shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the replaced profile
            return
        # No atomic exchange: rename the old profile aside, ours in, then drop the old one. A reader
        # in between finds no directory (an error, never a mixed profile).
        aside = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(target, aside)
        except FileNotFoundError:
            continue
        try:
            os.rename(tmp, target)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                with contextlib.suppress(OSError):
                    os.rename(aside, target)  # put the old profile back rather than leave none
                raise
            shutil.rmtree(aside, ignore_errors=True)  # another writer's landed meanwhile: it wins, try again
            continue
        shutil.rmtree(aside, ignore_errors=True)
        return


@dataclass
class Profile:
    """A profile read from disk. `sketches` is the polars sketch table; samples load lazily."""

    path: Path
    meta: dict[str, Any]
    sketches: "pl.DataFrame"
    index: list[dict[str, Any]] = field(default_factory=list)

    def ops(self) -> list[str]:
        return sorted(set(self.sketches["op"].to_list()))

    def triples(self) -> list[tuple[str, str, str]]:
        """Distinct (op, variant, dtype) captured."""
        rows = self.sketches.select("op", "variant", "dtype").unique().rows()
        return sorted((str(a), str(b), str(c)) for a, b, c in rows)

    def streams(self, op: str | None = None) -> list[str]:
        df = self.sketches if op is None else self.sketches.filter(self.sketches["op"] == op)
        return sorted(set(df["stream"].to_list()))

    def features(self, op: str, variant: str | None = None, dtype: str | None = None) -> "pl.DataFrame":
        """The op's rows (optionally one variant/dtype) with only the op's feature columns."""
        import polars as pl

        cond = pl.col("op") == op
        if variant is not None:
            cond &= pl.col("variant") == variant
        if dtype is not None:
            cond &= pl.col("dtype") == dtype
        return self.sketches.filter(cond).select(list(SKETCH_FEATURES[op]))

    def sample(self, i: int) -> Case:
        """Raw inputs of sample i as a Case (family "profile-tensor:<stream>")."""
        from safetensors import safe_open

        entry = self.index[i]
        t_path = self.path / TENSOR_FILE
        try:
            with safe_open(str(t_path), framework="pt") as f:
                pid = self.meta.get("profile_id")
                if pid is not None and (f.metadata() or {}).get("profile_id") != pid:
                    # Samples are read lazily from the path: another capture may have replaced the directory.
                    raise ProfileError(f"{t_path}: written by another capture since this profile was read "
                                       "(the directory was replaced): read the profile again")
                inputs = {name: f.get_tensor(key) for name, key in entry["tensors"].items()}
        except ProfileError:
            raise
        except BaseException as e:  # noqa: BLE001  SafetensorError, OSError, or a Rust panic (PanicException)
            if not _file_fault(e):
                raise
            raise ProfileError(f"{t_path}: cannot read sample {i}: {_first_line(e)}") from None
        return Case(inputs, dict(entry.get("params") or {}), f"profile-tensor:{entry.get('stream', '')}")

    def samples(self, op: str | None = None, variant: str | None = None, dtype: str | None = None) -> list[Case]:
        return [self.sample(i) for i, e in enumerate(self.index)
                if (op is None or e["op"] == op) and (variant is None or e["variant"] == variant)
                and (dtype is None or e["dtype"] == dtype)]

    def summary(self) -> dict[str, Any]:
        return {"model": self.meta.get("model"), "calls": self.sketches.height, "samples": len(self.index),
                "triples": self.triples(), "streams": len(self.streams())}


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:160] if lines else ''}"


def _file_fault(e: BaseException) -> bool:
    """Whether a reader's exception can be blamed on the file: any Exception but MemoryError (the
    machine's state, not the file's), and a Rust panic in polars or safetensors, which pyo3 raises as
    PanicException, a BaseException. Not KeyboardInterrupt, SystemExit or GeneratorExit."""
    if isinstance(e, MemoryError):
        return False
    return isinstance(e, Exception) or any(c.__name__ == "PanicException" for c in type(e).__mro__)


def _fail(path: Path, why: str) -> ProfileError:
    return ProfileError(f"{path}: {why}")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise _fail(path, "missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(path, f"not valid JSON ({str(e).splitlines()[0]})") from None


def _profile_id(root: Path) -> str | None:
    try:
        meta = json.loads((root / META_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return meta.get("profile_id") if isinstance(meta, dict) else None


def read_profile(path: str | Path) -> Profile:
    """Read and check a profile directory; ProfileError (one line) when anything is missing or corrupt.

    The files are read one by one; if profile.json's id changed meanwhile, a capture replaced the
    directory mid-read and what was read may mix two profiles, so it is read again."""
    root = Path(path)
    for _ in range(5):
        before = _profile_id(root)
        try:
            p = _read_profile_once(root)
        except ProfileError:
            if before is not None and _profile_id(root) != before:
                continue
            raise
        if p.meta.get("profile_id") == before == _profile_id(root):
            return p
        if before is None and p.meta.get("profile_id") is None:
            return p  # written before profiles had ids: nothing to compare
    raise ProfileError(f"{root}: replaced by other captures during each of 5 reads; read it when they finish")


def _read_profile_once(root: Path) -> Profile:
    import polars as pl

    if root.is_file():  # telling to capture into a file's path would only meet capture's own refusal
        if (root.parent / META_FILE).is_file():  # profile.json or another file of a profile: the usual slip
            raise ProfileError(f"{root} is a file of the profile in {root.parent}: pass that directory")
        raise ProfileError(f"{root} is a file, not a profile directory (`optwin capture --out DIR` writes one)")
    if not root.is_dir():
        raise ProfileError(f"no profile directory at {root}: run `optwin capture --out {root}`")
    meta = _read_json(root / META_FILE)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise _fail(root / META_FILE, f"not an optwin profile (format {meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version") != FORMAT_VERSION:
        raise _fail(root / META_FILE, f"profile format version {meta.get('version')!r}; this optwin reads {FORMAT_VERSION}")
    sk_path = root / SKETCH_FILE
    if not sk_path.is_file():
        raise _fail(sk_path, "missing")
    try:
        df = pl.read_parquet(sk_path)
    except BaseException as e:  # noqa: BLE001  polars raises several classes for corrupt files, and on some
        # (a flipped bit in a page header) panics in Rust (_file_fault).
        if not _file_fault(e):
            raise
        raise _fail(sk_path, f"corrupt or truncated parquet ({_first_line(e)})") from None
    missing = [c for c in BASE_COLUMNS + ALL_FEATURES if c not in df.columns]
    if missing:
        raise _fail(sk_path, f"missing columns {', '.join(missing)} (written by an older optwin whose sketch "
                             "lacked them: capture the profile again)")
    n_calls = meta.get("n_calls")
    if isinstance(n_calls, int) and n_calls != df.height:
        raise _fail(sk_path, f"holds {df.height} rows but profile.json says {n_calls} calls (truncated?)")
    unknown = sorted(set(df["op"].to_list()) - set(CATALOG))
    if unknown:
        raise _fail(sk_path, f"unknown operators {', '.join(map(str, unknown))}")
    index = _read_index(root)
    _verify_checksums(root, meta)  # after the checks above, whose messages say more than "checksum"
    return Profile(root, meta, df, index)


def _verify_checksums(root: Path, meta: dict[str, Any]) -> None:
    """Each data file against the sha256 profile.json holds. Profiles written before optwin recorded
    checksums have none and are read unverified (a flipped bit there can pass as a changed value)."""
    sums = meta.get("checksums")
    if sums is None:
        return
    if not isinstance(sums, dict):
        raise _fail(root / META_FILE, f"'checksums' is a {type(sums).__name__}, not an object")
    for name in DATA_FILES:
        want, f = sums.get(name), root / name
        if not isinstance(want, str):
            raise _fail(root / META_FILE, f"no sha256 checksum for {name}")
        try:
            got = _sha256(f)
        except FileNotFoundError:
            raise _fail(f, "missing (profile.json holds its checksum)") from None
        except OSError as e:
            raise _fail(f, f"unreadable ({e.strerror or e})") from None
        if got != want:
            raise _fail(f, f"sha256 checksum {got[:16]}... differs from profile.json's {want[:16]}...: "
                           "the file is corrupt or was changed since the capture")


def _read_index(root: Path) -> list[dict[str, Any]]:
    from safetensors import safe_open

    t_path, i_path = root / TENSOR_FILE, root / INDEX_FILE
    if not t_path.exists() and not i_path.exists():
        return []
    idx = _read_json(i_path)
    if not isinstance(idx, dict) or not isinstance(idx.get("samples"), list):
        raise _fail(i_path, "expected an object with a 'samples' list")
    if idx.get("version") != FORMAT_VERSION:
        raise _fail(i_path, f"index format version {idx.get('version')!r}; this optwin reads {FORMAT_VERSION}")
    if not t_path.is_file():
        raise _fail(t_path, "missing (the index lists samples)")
    try:
        with safe_open(str(t_path), framework="pt") as f:
            keys = set(f.keys())
            shapes = {k: f.get_slice(k).get_shape() for k in keys}
    except BaseException as e:  # noqa: BLE001  SafetensorError, OSError, ValueError, or a Rust panic
        if not _file_fault(e):
            raise
        raise _fail(t_path, f"corrupt or truncated safetensors ({_first_line(e)})") from None
    for s in idx["samples"]:  # each entry's form first: the tensor lookups below index into it
        t = s.get("tensors") if isinstance(s, dict) else None
        if (not isinstance(s, dict) or s.get("op") not in CATALOG or not isinstance(t, dict)
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in t.items())
                or not isinstance(s.get("params") or {}, dict)):
            raise _fail(i_path, f"malformed sample entry {str(s)[:80]}")
        # The names must be the op's inputs exactly: a build replays each sample through the op, and one
        # lacking an input (layernorm without bias) was rejected case by case, silently, exit 0.
        want = CATALOG[s["op"]].input_names()
        if set(t) != set(want):
            raise _fail(i_path, f"sample {s.get('id', '?')!s:.20} ({s['op']}) has tensors {', '.join(sorted(t)) or 'none'}; "
                                f"{s['op']} takes {', '.join(want)}")
    need = {k for s in idx["samples"] for k in s["tensors"].values()}
    absent = sorted(need - keys)
    if absent:
        raise _fail(t_path, f"missing tensors {', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''}")
    for s in idx["samples"]:
        if any(math.prod(shapes[k]) < 0 for k in s["tensors"].values()):
            raise _fail(t_path, "negative shape")
    return idx["samples"]
