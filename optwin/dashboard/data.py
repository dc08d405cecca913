"""Read-only queries the dashboard pages need, over a fingerprint database (schema v1).

    python -c "from optwin.dashboard.data import open_data; print(open_data('fingerprints.duckdb').builds())"

The pages never touch the database: they call the methods here, which read through the fingerprint
store (`optwin.fingerprints.store.open_store(path, read_only=True)`, parameterised queries, its own
one-line errors) and return pandas DataFrames. The store offers row selections by build/op/variant/
dtype; the dashboard's aggregates (per-triple counts, fault totals, build-to-build diffs, pooled
probabilities) are computed here in pandas over those selections (Arrow tables, so no row-by-row
Python). The file may be replaced underneath us by a rebuild (`os.replace`): a DashboardData is a
snapshot of one file version, and `file_identity` tells the app when to open a new one.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from optwin.catalog import FAULT_TYPES, operator
from optwin.errors import DatabaseError
from optwin.fingerprints.migrations.v0001_initial import TABLES
from optwin.fingerprints.regions import FLAGS, bin_lower_edge, feature_bin, parse_region_key
from optwin.fingerprints.stats import wilson


def file_identity(path: str | os.PathLike) -> tuple[int, int, int] | None:
    """(inode, mtime_ns, size) of the file, or None when it is missing: changes on every rebuild."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def served_probability(df: pd.DataFrame, source: str = "fingerprint rows", strict: bool = False,
                       errors: list[str] | None = None) -> pd.Series:
    """Per fingerprint row, the probability the matcher serves for that row's cell, from the matcher's own code
    (`Matcher.from_rows` over these rows, then `TripleIndex.lookup` of the row's region): the noisy replays'
    fault rate blended with the deterministic emulation (`MatcherConfig.det_weight`), and for fault types with
    their own features the pooled marginal cell. The row's `probability` column is the replays' rate alone,
    which is not what warns: the two fall on opposite sides of the threshold in some cells.

    The matcher refuses an op whose rows were binned on other region features (a database from an older
    catalog, `binning_errors`): with `strict` its one-line DatabaseError (naming `source`) is raised, else that
    op's rows are NaN and the line is appended to `errors` (when given), op by op in sorted order: a caller that
    shows both gets them from one index build per op. Each op is indexed apart, so one refused op leaves the
    others' probabilities standing.
    """
    from optwin.errors import OptwinError
    from optwin.fingerprints.matcher import Matcher, MatcherConfig

    out = pd.Series(float("nan"), index=df.index, dtype="float64")
    if df.empty:
        return out
    cfg = MatcherConfig()
    rows = df.astype(object).where(df.notna(), None).to_dict("records")  # NaN det_faults -> None, as SQL NULL
    for op in sorted(df["op"].unique()):
        mine = [r for r in rows if r["op"] == op]
        try:
            m = Matcher.from_rows(mine, config=cfg, source=source)
        except OptwinError as e:
            if strict:
                raise
            if errors is not None:
                errors.append(str(e))
            continue
        at = df.index[(df["op"] == op).to_numpy()]
        for i, r in zip(at, mine):
            ti = m.index.get((r["op"], r["variant"], r["dtype"]))
            if ti is not None and r["fault_type"] in ti.fault_types:
                out[i] = ti.lookup(parse_region_key(r["region"]), cfg)[0][ti.fault_types.index(r["fault_type"])]
    return out


def pool(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Pool fingerprint rows over everything not in `by`: probability = sum(faults) / sum(replays), the noisy
    replays' fault rate; p_matcher = the matcher's served probability (`served_probability`, column
    `p_matcher` of the rows) averaged with the replays as weights, as the matcher pools its marginal cells.

    Pooling counts (not averaging probabilities) weights each region by the evidence it holds, and
    the Wilson interval of the pooled counts, over the pooled cases (stats.py), shows how much evidence that is.
    """
    cols = [*by, "probability", "p_matcher", "ci_low", "ci_high", "ci_width", "n_faults", "n_replays", "n_cases"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    weighted = df["p_matcher"] * df["n_replays"] if "p_matcher" in df else pd.Series(float("nan"), index=df.index)
    g = df.assign(_pm=weighted).groupby(by, as_index=False, sort=True).agg(
        n_faults=("n_faults", "sum"), n_replays=("n_replays", "sum"), n_cases=("n_cases", "sum"),
        _pm=("_pm", lambda s: s.sum(min_count=len(s))),  # one NaN (not served) leaves the pool unknown
    )
    g["probability"] = [k / n if n > 0 else float("nan") for k, n in zip(g.n_faults, g.n_replays)]
    g["p_matcher"] = [w / n if n > 0 else float("nan") for w, n in zip(g._pm, g.n_replays)]
    ci = [wilson(int(k), int(n), n_eff=int(c)) for k, n, c in zip(g.n_faults, g.n_replays, g.n_cases)]
    g["ci_low"] = [c[0] for c in ci]
    g["ci_high"] = [c[1] for c in ci]
    g["ci_width"] = g.ci_high - g.ci_low
    return g[cols]


def boundary(curve: pd.DataFrame, feature: str, threshold: float, column: str = "probability") -> float | None:
    """The lowest `feature` value (bin lower edge) whose pooled probability (`column`) reaches `threshold`."""
    hit = curve[curve[column] >= threshold]
    return float(hit[feature].min()) if len(hit) else None


def bin_value(feature: str, b: int) -> float:
    """The value a region bin stands for in tables, axes and boundaries: its lower edge (`bin_lower_edge`), and
    for a flag (regions.FLAGS) the flag itself, 0 or 1, from the bins `feature_bin` puts them in."""
    if feature in FLAGS:
        for v in (0.0, 1.0):
            if feature_bin(feature, v) == b:
                return v
    return bin_lower_edge(feature, b)


def with_region_features(df: pd.DataFrame, op: str) -> pd.DataFrame:
    """Add per region feature a bin column `bin:<f>` and its value column `<f>` (`bin_value`).

    A region key with another number of bins than the op's features (binned on an older catalog) raises the
    DatabaseError the matcher raises for it, rather than padding the missing bins with made-up zeros."""
    feats = operator(op).region_features
    out = df.copy()
    bins = [parse_region_key(k) for k in out["region"]] if len(out) else []
    if any(len(b) != len(feats) for b in bins):  # fingerprints() has the matcher refuse it first; rows from elsewhere
        raise DatabaseError(f"{op}: region keys of {len(feats)} bins expected ({', '.join(feats)}): binned on "
                            "another optwin's region features; rebuild with `optwin build`")
    for i, f in enumerate(feats):
        out[f"bin:{f}"] = [b[i] for b in bins]
        out[f] = [bin_value(f, b) for b in out[f"bin:{f}"]]
    return out


@dataclass(frozen=True)
class CaseDetail:
    """One case with its outcome and parsed JSON columns (for the Cases page drill-down)."""

    row: dict[str, Any]
    sketch: dict[str, float]
    params: dict[str, Any]


# A pseudo build id: per (op, variant, dtype), the newest build that replayed it, which is what the
# matcher serves. After a build of some ops (`optwin build --ops X` into an existing file) the newest
# build holds only those ops; this is the state the live matcher and sidecar answer from.
SERVED = "(served by the matcher)"  # not an optwin build id (b<time>-<hash>)

_OUTCOME_COLS = ("replays", "noise", "det_nonfinite", "det_precision_loss", "det_low_entropy", "n_nonfinite",
                 "n_precision_loss", "n_low_entropy", "det_rel_error", "err_q50", "err_q90", "err_max")


class DashboardData:
    """A read-only view of one fingerprint database file, as it was when opened."""

    def __init__(self, path: str | os.PathLike):
        from optwin.fingerprints.store import open_store  # lazy: duckdb loads with the store

        self.path = os.path.abspath(os.fspath(path))
        self.identity = file_identity(self.path)
        self._store = open_store(self.path, read_only=True)  # DatabaseError / SchemaVersionError
        # one DuckDB connection behind the store; Streamlit serves sessions from several threads
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._store.close()

    def _df(self, method: str, **kw: Any) -> pd.DataFrame:
        """Rows of one store read method (named like its table) as a DataFrame."""
        with self._lock:
            read = getattr(self._store, method)
            try:
                return read(as_arrow=True, **kw).to_pandas()
            except AttributeError:
                # duckdb 2 dropped fetch_arrow_table, which the store's arrow path calls; rows work
                rows = read(**kw)
        return pd.DataFrame.from_records(rows, columns=[c for c, _, _ in TABLES[method]] if not rows else None)

    # --- builds -------------------------------------------------------------------------------

    def builds(self) -> pd.DataFrame:
        """All builds with their provenance, newest first."""
        df = self._df("builds")
        return df.sort_values(["created_at", "build_id"], ascending=False, kind="stable").reset_index(drop=True)

    def build_flags(self, build: str) -> dict[str, Any]:
        """The options a build recorded (builds.flags: ops, replays, tolerances ...), {} when unreadable."""
        b = self._df("builds")
        flags = b.loc[b["build_id"].astype(str) == str(build), "flags"]
        return _json(flags.iloc[0]) if len(flags) else {}

    def served_builds(self) -> list[str]:
        """The builds the matcher serves some triple from, newest first (more than one after a partial build)."""
        order = [str(b) for b in self.builds()["build_id"]]
        got = set(self.served()["build_id"].astype(str))
        return [b for b in order if b in got]

    def _rows(self, method: str, build: str, **kw: Any) -> pd.DataFrame:
        """Rows of one store table for a build, or for SERVED each served triple's rows from the build the
        matcher serves it from (`outcomes` has no op column: join it to `cases` on (build_id, case_id))."""
        if build != SERVED:
            return self._df(method, build_id=build, **kw)
        key = self.served()[["op", "variant", "dtype", "build_id"]]
        parts = [self._df(method, build_id=b, **kw) for b in key["build_id"].unique()]
        if not parts:
            return self._df(method, build_id=build, **kw)  # no rows, the table's columns
        df = pd.concat(parts, ignore_index=True)
        if "op" not in df:
            return df
        return df.merge(key, on=["op", "variant", "dtype", "build_id"], how="inner")

    def current_build(self) -> str | None:
        with self._lock:
            return self._store.latest_build_id()

    def served(self) -> pd.DataFrame:
        """What the live matcher serves: per (op, variant, dtype), the newest build that replayed it and its
        regions (a build of some ops keeps the other ops' older fingerprints current)."""
        with self._lock:
            rows = self._store.current_fingerprints()
        cols = ["op", "variant", "dtype", "build_id", "n_regions"]
        if not rows:
            return pd.DataFrame(columns=cols)
        df = pd.DataFrame.from_records(rows)
        g = df.groupby(["op", "variant", "dtype", "build_id"], as_index=False, sort=True).agg(n_regions=("region", "nunique"))
        return g[cols]

    # --- overview -----------------------------------------------------------------------------

    def _cases_outcomes(self, build: str) -> pd.DataFrame:
        cases = self._rows("cases", build)[["build_id", "case_id", "op", "variant", "dtype", "region", "held_out"]]
        outs = self._outcomes_of(cases)
        return cases.merge(outs, on=["build_id", "case_id"], how="left")

    def _outcomes_of(self, cases: pd.DataFrame, case_ids: Sequence[int] | None = None) -> pd.DataFrame:
        """Outcome rows of the builds in `cases` (optionally only `case_ids`); merge on (build_id, case_id):
        a case id recurs in builds of one seed."""
        parts = [self._df("outcomes", build_id=str(b), case_ids=case_ids) for b in cases["build_id"].unique()]
        return pd.concat(parts, ignore_index=True) if parts else self._df("outcomes", build_id=SERVED)

    def ops_covered(self, build: str) -> pd.DataFrame:
        """Per op/variant/dtype: cases, held-out cases, replays, and regions with fingerprints (as the Regions
        headline and the Explorer count them: fingerprints are made of the non-held-out cases only, so a
        region only held-out cases fall in has none)."""
        df = self._cases_outcomes(build)
        cols = ["op", "variant", "dtype", "n_cases", "n_held_out", "n_replays", "n_regions"]
        if df.empty:
            return pd.DataFrame(columns=cols)
        triple = ["op", "variant", "dtype"]
        g = df.groupby(triple, as_index=False, sort=True).agg(
            n_cases=("case_id", "size"), n_held_out=("held_out", "sum"), n_replays=("replays", "sum"))
        fp = self._rows("fingerprints", build)
        regions = fp.groupby(triple, as_index=False).agg(n_regions=("region", "nunique"))
        g = g.merge(regions, on=triple, how="left").fillna({"n_regions": 0})
        return g.astype({"n_held_out": "int64", "n_replays": "int64", "n_regions": "int64"})[cols]

    def totals(self, build: str) -> dict[str, int]:
        """Counts for the overview's headline numbers."""
        df = self._cases_outcomes(build)
        fp = self._rows("fingerprints", build)
        return {
            "cases": len(df),
            "ops": int(df["op"].nunique()),
            "triples": int(df.groupby(["op", "variant", "dtype"]).ngroups) if len(df) else 0,
            "replays": int(df["replays"].fillna(0).sum()),
            "regions": int(fp.groupby(["op", "variant", "dtype", "region"]).ngroups) if len(fp) else 0,
        }

    def fault_totals(self, build: str) -> pd.DataFrame:
        """Per fault type: cases whose deterministic emulation faults, faulting replays, and the
        cases where the type applies (low_entropy only for softmax and attention)."""
        o = self._cases_outcomes(build)
        rows = []
        for ft in FAULT_TYPES:
            det = o[f"det_{ft}"]
            rows.append({"fault_type": ft, "det_cases": int(det.fillna(False).astype(bool).sum()),
                         "faulting_replays": int(o[f"n_{ft}"].fillna(0).sum()),
                         "applicable_cases": int(det.notna().sum())})
        return pd.DataFrame(rows)

    # --- fingerprints -------------------------------------------------------------------------

    def triples(self, build: str) -> pd.DataFrame:
        """The (op, variant, dtype) triples the build fingerprinted."""
        fp = self._rows("fingerprints", build)
        return fp[["op", "variant", "dtype"]].drop_duplicates().sort_values(["op", "variant", "dtype"]).reset_index(drop=True)

    def fingerprints(self, build: str, op: str, variant: str | None = None, dtype: str | None = None,
                     fault_type: str | None = None) -> pd.DataFrame:
        """Fingerprint rows of one op (optionally one variant/dtype/fault type), with bin columns and the
        matcher's served probability (`p_matcher`; `probability` is the replays' fault rate).

        DatabaseError (one line, the matcher's) when the op's rows were binned on other region features than
        this optwin's: an older database the matcher refuses, whose cells mean something else here."""
        df = self._rows("fingerprints", build, op=op, variant=variant, dtype=dtype)
        df["p_matcher"] = served_probability(df, source=self.path, strict=True)
        if fault_type is not None:
            df = df[df["fault_type"] == fault_type].reset_index(drop=True)
        return with_region_features(df, op)

    def binning_errors(self, build: str) -> list[str]:
        """One line per op of the build whose fingerprints the matcher refuses (binned on other region features
        than this optwin's: an older catalog), the matcher's own DatabaseError text; [] when it reads them all."""
        errors: list[str] = []
        served_probability(self._df("fingerprints", build_id=build), source=self.path, errors=errors)
        return errors

    # --- cases --------------------------------------------------------------------------------

    def _case_rows(self, build: str, case_ids: Sequence[int]) -> pd.DataFrame:
        ids = [int(i) for i in case_ids]
        cases = self._rows("cases", build, case_ids=ids)
        outs = self._outcomes_of(cases, ids)
        return cases.merge(outs[["build_id", "case_id", *_OUTCOME_COLS]], on=["build_id", "case_id"], how="left")

    def representatives(self, build: str, op: str, variant: str, dtype: str,
                        fault_type: str | None = None) -> pd.DataFrame:
        """Representative failing cases of one triple, worst relative error first."""
        reps = self._rows("representatives", build, op=op, variant=variant, dtype=dtype, fault_type=fault_type)
        cols = ["case_id", "fault_type", "region", "rel_error", "source", "family", "seed", "case_index", "shard",
                "replays", "err_q50", "err_q90", "err_max"]
        if reps.empty:
            return pd.DataFrame(columns=cols)
        info = self._case_rows(build, reps["case_id"].unique().tolist()).drop(columns=["region"])
        df = reps[["build_id", "case_id", "fault_type", "region", "rel_error"]].merge(info, on=["build_id", "case_id"],
                                                                                      how="left")
        return df.sort_values(["rel_error", "case_id"], ascending=[False, True], na_position="last")[cols].reset_index(drop=True)

    def case(self, build: str, case_id: int) -> CaseDetail | None:
        """One case joined with its outcome, or None."""
        df = self._case_rows(build, [case_id])
        if df.empty:
            return None
        row = {k: _plain(v) for k, v in df.iloc[0].to_dict().items()}
        return CaseDetail(row=row, sketch=_json(row.get("sketch")), params=_json(row.get("params")))

    # --- compare ------------------------------------------------------------------------------

    def replayed(self, build: str) -> pd.DataFrame:
        """The (op, variant, dtype) triples a build replayed (has cases of), whether or not it fingerprinted them."""
        cases = self._df("cases", build_id=build)
        return cases[["op", "variant", "dtype"]].drop_duplicates().reset_index(drop=True)

    def _not_replayed_by(self, df: pd.DataFrame, build: str) -> pd.Series:
        """Per row of `df`, True where `build` did not replay the row's (op, variant, dtype)."""
        got = self.replayed(build).assign(_in=True)
        return df[["op", "variant", "dtype"]].merge(got, on=["op", "variant", "dtype"], how="left")["_in"].isna().to_numpy()

    def compare(self, build_a: str, build_b: str, op: str | None = None) -> pd.DataFrame:
        """Fingerprints of two builds side by side: status new / removed / not rebuilt / changed / same. p_matcher_*
        is what the matcher serves for the cell (`served_probability`), p_replays_* the noisy replays' fault rate;
        delta = p_matcher_b - p_matcher_a. Changed: either probability differs. Not rebuilt: only in A, of a
        triple B did not replay (a build of some ops, `optwin build --ops X`): B left it as it was, and the
        matcher still serves it from an older build; "removed" is for triples B replayed without that cell."""
        return self.comparison(build_a, build_b, op)[0]

    def comparison(self, build_a: str, build_b: str, op: str | None = None) -> tuple[pd.DataFrame, list[str]]:
        """(`compare`, the `binning_errors` of build A then of B, once when A is B, for `op` or every op): what the
        Compare page shows, from one matcher index per op of each build. The page asked for both separately, and
        binning_errors indexed every op a second time only to see whether the matcher refuses it."""
        key = ["op", "variant", "dtype", "region", "fault_type"]
        keep = [*key, "p_matcher", "p_replays", "n_replays"]
        errors: list[str] = []

        def side(build: str) -> pd.DataFrame:
            df = self._df("fingerprints", build_id=build, op=op)
            p = served_probability(df, source=self.path, errors=errors)
            return df.assign(p_matcher=p, p_replays=df["probability"])[keep]

        sides = {b: side(b) for b in dict.fromkeys([build_a, build_b])}  # A against itself: indexed once
        df = sides[build_a].merge(sides[build_b], on=key, how="outer", suffixes=("_a", "_b"), indicator=True)
        df["delta"] = df["p_matcher_b"] - df["p_matcher_a"]
        status = df["_merge"].map({"left_only": "removed", "right_only": "new", "both": "same"}).astype(str)
        status = status.where(~((status == "removed") & self._not_replayed_by(df, build_b)), "not rebuilt")
        changed = (status == "same") & (_differ(df["p_matcher_a"], df["p_matcher_b"])
                                        | _differ(df["p_replays_a"], df["p_replays_b"]))
        df["status"] = status.where(~changed, "changed")
        df = df.drop(columns=["_merge"])
        order = df["delta"].abs().fillna(1.0)
        df = df.assign(_o=order).sort_values(["_o", *key], ascending=[False, True, True, True, True, True])
        return df.drop(columns=["_o"])[[*key, "p_matcher_a", "p_matcher_b", "delta", "p_replays_a", "p_replays_b",
                                        "n_replays_a", "n_replays_b", "status"]].reset_index(drop=True), errors

    def region_changes(self, build_a: str, build_b: str) -> pd.DataFrame:
        """Regions (op/variant/dtype/region) present in only one of the two builds; those only in A of a triple
        B did not replay are "not rebuilt", not removed (as in `compare`)."""
        key = ["op", "variant", "dtype", "region"]
        a = self._df("fingerprints", build_id=build_a)[key].drop_duplicates()
        b = self._df("fingerprints", build_id=build_b)[key].drop_duplicates()
        df = a.merge(b, on=key, how="outer", indicator=True)
        df = df[df["_merge"] != "both"]
        df.insert(0, "status", df.pop("_merge").map({"left_only": "removed", "right_only": "new"}).astype(str))
        df["status"] = df["status"].where(~((df["status"] == "removed") & self._not_replayed_by(df, build_b)),
                                          "not rebuilt")
        return df.sort_values(["status", *key]).reset_index(drop=True)


def open_data(path: str | os.PathLike) -> DashboardData:
    """Open a fingerprint database read-only; DatabaseError with one line when it can't be."""
    return DashboardData(path)


def _differ(a: pd.Series, b: pd.Series) -> pd.Series:
    """a != b, except that NaN on both sides is no change: a cell the matcher serves neither build (NaN
    p_matcher) or without replays in either is the same cell, and NaN != NaN would call it changed."""
    return (a != b) & ~(a.isna() & b.isna())


def _json(text: Any) -> dict[str, Any]:
    if not isinstance(text, str) or not text:
        return {}
    try:
        v = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return v if isinstance(v, dict) else {}


def _plain(v: Any) -> Any:
    """numpy/pandas scalars -> Python values (None for NA) for display and snippets."""
    if v is None:
        return None
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return v.item() if hasattr(v, "item") else v
