"""What every dashboard page shares: settings, the cached read-only database, the build picker.

    streamlit run optwin/dashboard/app.py -- --db fingerprints.duckdb [--sidecar http://127.0.0.1:8787]

Settings come from, in order: `st.session_state` ("optwin_db", "optwin_sidecar"; tests set these),
the script arguments after `--`, then the environment (OPTWIN_DB, OPTWIN_SIDECAR). The sidecar's token
comes only from session state ("optwin_sidecar_token") or OPTWIN_SIDECAR_TOKEN, never the command line
(which every local user can read in `ps`).

The database is a `st.cache_resource` keyed by (path, file identity): a rebuild replaces the file
(`os.replace`), its inode/mtime change, and the next rerun opens the new file; `st.cache_data`
results are keyed the same way, so nothing stale survives a rebuild.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from optwin.dashboard.data import SERVED, DashboardData, file_identity, open_data
from optwin.errors import OptwinError


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--db")
    p.add_argument("--sidecar")
    # sys.argv is the script's own args under `streamlit run`; under AppTest it is pytest's
    ns, _ = p.parse_known_args(sys.argv[1:])
    return ns


def db_path() -> str | None:
    return st.session_state.get("optwin_db") or _args().db or os.environ.get("OPTWIN_DB") or None


def sidecar_url() -> str | None:
    url = st.session_state.get("optwin_sidecar") or _args().sidecar or os.environ.get("OPTWIN_SIDECAR")
    return url.rstrip("/") if url else None


def sidecar_token() -> str | None:
    return st.session_state.get("optwin_sidecar_token") or os.environ.get("OPTWIN_SIDECAR_TOKEN") or None


@st.cache_resource(max_entries=2, show_spinner=False)
def _open(path: str, identity: tuple[int, int, int]) -> DashboardData:
    # identity is only part of the cache key: a changed file is a new entry, the old one is evicted
    return open_data(path)


@st.cache_data(max_entries=512, show_spinner=False)
def _cached(path: str, identity: tuple[int, int, int], method: str, args: tuple[Any, ...]) -> Any:
    return getattr(_open(path, identity), method)(*args)


@dataclass(frozen=True)
class Context:
    """The open database of this rerun and the build the sidebar picked."""

    path: str
    identity: tuple[int, int, int]
    build: str
    builds: pd.DataFrame

    def q(self, method: str, *args: Any) -> Any:
        """A cached call of `DashboardData.<method>(*args)` on this file version."""
        return _cached(self.path, self.identity, method, tuple(args))


def open_db(path: str | None) -> tuple[str, tuple[int, int, int]] | str:
    """(path, identity) of an openable database, or a one-line message why it is not."""
    if not path:
        return "No fingerprint database configured: start with `optwin dashboard --db PATH`."
    identity = file_identity(path)
    if identity is None:
        return f"no fingerprint database at {path}: run `optwin build`"
    try:
        _open(path, identity)
    except OptwinError as e:
        return str(e)
    return (path, identity)


def page_context(required: bool = True) -> Context | None:
    """Sidebar (database, build picker) and the page's Context; stops the page with a message when
    the database is missing or foreign (returns None instead when not `required`)."""
    got = open_db(db_path())
    if isinstance(got, str):
        (st.error if required else st.info)(got)
        if required:
            st.stop()
        return None
    path, identity = got
    builds = _cached(path, identity, "builds", ())
    if builds.empty:
        (st.warning if required else st.info)(f"{path} holds no builds yet: run `optwin build`")
        if required:
            st.stop()
        return None
    ids = [str(b) for b in builds["build_id"]]
    created = dict(zip(ids, builds["created_at"]))
    served_from = _cached(path, identity, "served_builds", ())
    if len(served_from) > 1:
        # after a build of some ops the newest build is not the whole state: the matcher serves each triple
        # from the newest build that replayed it, and that is what the pages show unless a build is picked
        ids = [SERVED, *ids]
    picked, was_newest = st.session_state.get("build"), st.session_state.get("_build_newest")
    # a rebuild may drop the picked build; one who watched the current build follows it to the new one
    if picked not in ids or (picked == was_newest and ids[0] != was_newest):
        st.session_state["build"] = ids[0]
    st.session_state["_build_newest"] = ids[0]
    st.sidebar.caption(f"database: `{path}`")
    build = st.sidebar.selectbox(
        "Build", ids, key="build",
        format_func=lambda b: (f"what the matcher serves: newest build of each operator ({', '.join(served_from)})"
                               if b == SERVED else f"{b} ({str(created[b])[:16]})"),
        help="The current state: what the matcher serves, each op/variant/dtype from the newest build that "
             "replayed it (the newest build when it replayed everything).",
    )
    for b in (served_from if build == SERVED else [build]):
        _twin_version_note(builds, b)
    return Context(path=path, identity=identity, build=build, builds=builds)


def _twin_version_note(builds: Any, build: str) -> None:
    """A sidebar warning when the picked build was replayed by other twins than this optwin's (as the matcher
    logs for what it serves): its fingerprints are evidence of those twins' numerics, not of today's."""
    from optwin.twin import TWIN_VERSION

    if "twin_version" not in builds:
        return
    versions = builds.loc[builds["build_id"].astype(str) == build, "twin_version"]
    got = None if versions.empty else versions.iloc[0]
    # NULL reads as None, NaN or pd.NA depending on its column's other rows: all are "unknown" (as the matcher says)
    label = got if isinstance(got, str) and got else "unknown"
    if label != TWIN_VERSION:
        st.sidebar.warning(f"build {build} was replayed by twin version {label}; this optwin's twins are version "
                           f"{TWIN_VERSION}: `optwin build` replays them anew")


def pick(label: str, options: list[Any], key: str, default: Any = None, **kw: Any) -> Any:
    """A selectbox whose stale value (not in options after another choice changed) resets to
    `default` (or the first option)."""
    if not options:
        st.info(f"nothing to choose for {label.lower()}")
        return None
    if st.session_state.get(key) not in options:
        st.session_state[key] = default if default in options else options[0]
    return st.selectbox(label, options, key=key, **kw)


def pick_triple(ctx: Context, prefix: str) -> tuple[str, str, str, Any]:
    """Operator, variant and dtype pickers over the triples this build covers, in the first three
    of four columns; returns (op, variant, dtype, fourth column). Stops the page when the build has
    no fingerprints or nothing is picked."""
    from optwin.catalog import CATALOG, operator

    triples = ctx.q("triples", ctx.build)
    if triples.empty:
        st.info(f"build {ctx.build} has no fingerprints")
        st.stop()
    # a database written by an optwin with more operators: this one has no spec (variants, region
    # features) to show theirs by, so they are left out, said once, instead of failing the page
    unknown = sorted(set(triples["op"]) - set(CATALOG))
    if unknown:
        st.info(f"not shown: operator{'s' if len(unknown) > 1 else ''} {', '.join(map(str, unknown))} of build "
                f"{ctx.build}, unknown to this optwin (its catalog: {', '.join(CATALOG)})")
        triples = triples[triples["op"].isin(list(CATALOG))]
        if triples.empty:
            st.stop()
    c1, c2, c3, c4 = st.columns(4)
    with c1:
        op = pick("Operator", sorted(triples["op"].unique()), f"{prefix}_op")
    spec = operator(op)
    of_op = triples[triples.op == op]
    with c2:
        variant = pick("Variant", [v for v in spec.variant_names if v in set(of_op["variant"])], f"{prefix}_variant")
    with c3:
        dtype = pick("Dtype", [d for d in spec.dtypes if d in set(of_op[of_op.variant == variant]["dtype"])], f"{prefix}_dtype")
    if not (variant and dtype):
        st.stop()
    return op, variant, dtype, c4
