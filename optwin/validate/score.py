"""CPU side of `optwin validate`: score the matcher's verdicts against the device's fault labels.

    optwin validate --labels validate_gpu.json --db fingerprints.duckdb --json report.json

Input: the collection written by optwin.validate.collect (per held-out case: the sketch taken before
the op ran and, per variant, the spec's fault labels of the device output; per drift trace: the same
call by call with simulated times). The matcher only ever sees the sketch, so asking it here is the
same as asking it before the op ran.

Per (op, variant, dtype):
- AUROC per fault type of the matcher's probability against the label (with the count of
  positives; None when a class is empty), ties counted half (Mann-Whitney);
- recall and precision of `warn` against "the call faulted" (any fault type);
- Brier score per fault type and their mean; the fraction of sketches in replayed regions (known).
Per drift trace, kind and variant, fed through a matcher stream at its call times:
- the first warning, the first (device-labelled) fault, and the lead time between them (positive:
  the warning came first);
- false alarms: warned calls that did not fault, and warning episodes on streams that never fault
  (the flat controls report them; a stream that never faults cannot have an early warning).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

FAULT_ORDER = ("nonfinite", "precision_loss", "low_entropy")


# ----------------------------------------------------------------------------- metrics


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve: P(score of a random positive > score of a random negative), ties
    count 1/2 (the Mann-Whitney U statistic over n_pos * n_neg). None without both classes."""
    pairs = sorted(zip((float(s) for s in scores), (bool(y) for y in labels)))
    n_pos = sum(1 for _, y in pairs if y)
    n_neg = len(pairs) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    # Average ranks over tie groups (1-based), then U = sum of positive ranks - n_pos (n_pos + 1) / 2.
    rank_sum = 0.0
    i = 0
    while i < len(pairs):
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        avg_rank = (i + 1 + j) / 2.0  # ranks i+1 .. j
        rank_sum += avg_rank * sum(1 for k in range(i, j) if pairs[k][1])
        i = j
    u = rank_sum - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def brier(probs: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Mean squared difference between predicted probability and the 0/1 outcome."""
    if not probs:
        return None
    return sum((float(p) - float(bool(y))) ** 2 for p, y in zip(probs, labels)) / len(probs)


def warn_confusion(warns: Sequence[bool], labels: Sequence[bool]) -> dict[str, Any]:
    """tp/fp/fn/tn of `warn` against faults, recall = tp/(tp+fn), precision = tp/(tp+fp) (None on 0/0)."""
    tp = sum(1 for w, y in zip(warns, labels) if w and y)
    fp = sum(1 for w, y in zip(warns, labels) if w and not y)
    fn = sum(1 for w, y in zip(warns, labels) if not w and y)
    tn = len(warns) - tp - fp - fn
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn,
            "recall": tp / (tp + fn) if tp + fn else None, "precision": tp / (tp + fp) if tp + fp else None}


def lead_time(times: Sequence[float], warns: Sequence[bool], faults: Sequence[bool]) -> dict[str, Any]:
    """First warning vs first fault of one stream.

    lead_s = t(first fault) - t(first warning) when the first warning came no later than the first
    fault (0: on the faulting call itself, > 0: early); None when the stream never faults or the first
    warning came late or never (then `late_s` says by how much, None when it never warned).
    sustained_lead_s: from the start of the warning episode still open at the first fault (on that
    call or the one before it) to the fault: the warning an operator would be looking at.
    """
    t_warn = next((t for t, w in zip(times, warns) if w), None)
    t_fault = next((t for t, f in zip(times, faults) if f), None)
    out: dict[str, Any] = {"first_warn_t": t_warn, "first_fault_t": t_fault, "lead_s": None, "late_s": None,
                           "sustained_lead_s": None, "early": False, "missed": False}
    if t_fault is None:
        return out
    i_f = next(i for i, f in enumerate(faults) if f)
    # The warning episode still open at the fault (on the faulting call or the one before it).
    j = i_f if warns[i_f] else (i_f - 1 if i_f > 0 and warns[i_f - 1] else None)
    if j is not None:
        while j > 0 and warns[j - 1]:
            j -= 1
        out["sustained_lead_s"] = t_fault - times[j]
    if t_warn is not None and t_warn <= t_fault:
        out["lead_s"] = t_fault - t_warn
        out["early"] = t_warn < t_fault
    else:
        out["missed"] = True
        out["late_s"] = None if t_warn is None else t_warn - t_fault
    return out


def false_alarms(warns: Sequence[bool], faults: Sequence[bool]) -> dict[str, int]:
    """Warned calls that did not fault, and warning episodes (rising edges of warn) that saw no fault
    before they ended."""
    calls = sum(1 for w, f in zip(warns, faults) if w and not f)
    episodes = 0
    in_episode, episode_faulted = False, False
    for w, f in zip(warns, faults):
        if w and not in_episode:
            in_episode, episode_faulted = True, False
        if in_episode and f:
            episode_faulted = True
        if not w and in_episode:
            episodes += not episode_faulted
            in_episode = False
    if in_episode and not episode_faulted:
        episodes += 1
    return {"calls": calls, "episodes": episodes}


# ----------------------------------------------------------------------------- scoring

AssessFn = Callable[[str, str, str, dict[str, float]], Any]  # -> object with .probability .warn .known
StreamFn = Callable[[str, str, str, str], Any]  # (name, op, variant, dtype) -> object with .observe(sketch=, t=)


def _fault_types(outcomes: Iterable[dict[str, Any]]) -> list[str]:
    seen = {ft for o in outcomes for ft in o.get("labels", {})}
    return [ft for ft in FAULT_ORDER if ft in seen] + sorted(seen - set(FAULT_ORDER))


def score_cases(cases: Iterable[dict[str, Any]], assess: AssessFn) -> list[dict[str, Any]]:
    """One row per (op, variant, dtype) over the collected cases (errored outcomes skipped)."""
    per: dict[tuple[str, str, str], list[tuple[dict[str, Any], Any]]] = {}
    for c in cases:
        for variant, o in c["outcomes"].items():
            if "labels" not in o:
                continue
            risk = assess(c["op"], variant, c["dtype"], c["sketch"])
            per.setdefault((c["op"], variant, c["dtype"]), []).append((o["labels"], risk))
    rows = []
    for (op, variant, dtype), items in per.items():
        fts = _fault_types({"labels": lab} for lab, _ in items)
        row: dict[str, Any] = {"op": op, "variant": variant, "dtype": dtype, "n": len(items), "faults": {}}
        briers = []
        for ft in fts:
            y = [bool(lab.get(ft, False)) for lab, _ in items]
            p = [float(getattr(r, "probability", {}).get(ft, 0.0)) for _, r in items]
            b = brier(p, y)
            briers.append(b)
            row["faults"][ft] = {"positives": sum(y), "auroc": auroc(p, y), "brier": b}
        any_fault = [any(lab.values()) for lab, _ in items]
        row["positives"] = sum(any_fault)
        row["warn"] = warn_confusion([bool(r.warn) for _, r in items], any_fault)
        row["brier"] = sum(b for b in briers if b is not None) / len(briers) if briers else None
        row["known_frac"] = sum(1 for _, r in items if getattr(r, "known", True)) / len(items)
        rows.append(row)
    return rows


def score_traces(traces: Iterable[dict[str, Any]], make_stream: StreamFn) -> list[dict[str, Any]]:
    """One row per (trace, kind, variant): each variant's calls observed by its own matcher stream."""
    rows = []
    for tr in traces:
        for variant in tr["variants"]:
            calls = [c for c in tr["calls"] if "labels" in c["outcomes"].get(variant, {})]
            if not calls:
                continue
            s = make_stream(f"{tr['name']}/{tr['kind']}/{variant}", tr["op"], variant, tr["dtype"])
            times, warns, faults, etas = [], [], [], []
            for c in calls:
                r = s.observe(sketch=c["sketch"], t=c["t"])
                times.append(float(c["t"]))
                warns.append(bool(r.warn))
                faults.append(any(c["outcomes"][variant]["labels"].values()))
                etas.append(getattr(r, "eta_s", None))
            lt = lead_time(times, warns, faults)
            fa = false_alarms(warns, faults)
            # What the forecast said on the first warned call: its eta vs the real time left.
            i_w = next((i for i, w in enumerate(warns) if w), None)
            rows.append({
                "trace": tr["name"], "kind": tr["kind"], "op": tr["op"], "variant": variant, "dtype": tr["dtype"],
                "what": tr.get("what", ""), "calls": len(calls), "faulting_calls": sum(faults),
                "warned_calls": sum(warns), **lt, "false_alarm_calls": fa["calls"],
                "false_alarm_episodes": fa["episodes"],
                "eta_at_first_warn_s": None if i_w is None else etas[i_w],
            })
    return rows


def summarize(case_rows: list[dict[str, Any]], trace_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled numbers for the headline: warn recall/precision over all triples, AUROC medians,
    early warnings on faulting drift streams, false alarms on flat streams."""
    tp = sum(r["warn"]["tp"] for r in case_rows)
    fp = sum(r["warn"]["fp"] for r in case_rows)
    fn = sum(r["warn"]["fn"] for r in case_rows)
    aurocs: dict[str, list[float]] = {}
    for r in case_rows:
        for ft, f in r["faults"].items():
            if f["auroc"] is not None:
                aurocs.setdefault(ft, []).append(f["auroc"])
    faulting = [r for r in trace_rows if r["first_fault_t"] is not None]
    leads = sorted(r["lead_s"] for r in faulting if r["lead_s"] is not None)
    flat = [r for r in trace_rows if r["kind"] == "flat"]
    # The issue's goal is about drift traces; a flat control that faults (a random draw crossing a
    # boundary) is reported on its own rather than folded into "every drift trace warned early".
    drifting = [r for r in faulting if r["kind"] == "drift"]
    flat_faulting = [r for r in flat if r["first_fault_t"] is not None]
    return {
        "cases": sum(r["n"] for r in case_rows), "triples": len(case_rows),
        "warn_recall": tp / (tp + fn) if tp + fn else None, "warn_precision": tp / (tp + fp) if tp + fp else None,
        "auroc_median": {ft: _median(v) for ft, v in aurocs.items()},
        "faulting_streams": len(faulting), "early_warnings": sum(1 for r in faulting if r["early"]),
        "missed_streams": sum(1 for r in faulting if r["missed"]),
        "lead_s_median": _median(leads), "lead_s_min": leads[0] if leads else None, "lead_streams": len(leads),
        "flat_streams": len(flat), "flat_false_alarm_calls": sum(r["false_alarm_calls"] for r in flat),
        "flat_false_alarm_episodes": sum(r["false_alarm_episodes"] for r in flat),
        "flat_streams_with_faults": len(flat_faulting),
        "drift_faulting_streams": len(drifting), "drift_early_warnings": sum(1 for r in drifting if r["early"]),
        "flat_faults_unwarned": sum(1 for r in flat_faulting if r["missed"]),
    }


def _median(v: list[float]) -> float | None:
    if not v:
        return None
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def score_collection(data: dict[str, Any], matcher: Any, forecast: Any = None) -> dict[str, Any]:
    """The full report of a collection against an open Matcher."""
    assess = lambda op, v, dt, sk: matcher.assess(op, v, dt, sketch=sk)  # noqa: E731
    make_stream = lambda name, op, v, dt: matcher.stream(name, op, v, dt, forecast=forecast)  # noqa: E731
    case_rows = score_cases(data.get("cases", []), assess)
    trace_rows = score_traces(data.get("traces", []), make_stream)
    meta = {k: data.get(k) for k in ("device", "device_name", "torch", "triton", "seed", "seed_offset",
                                       "cases_per_group", "created_at", "duration_s")}
    return {"collection": meta, "build_id": getattr(matcher, "build_id", None),
            "threshold": getattr(getattr(matcher, "config", None), "threshold", None),
            "summary": summarize(case_rows, trace_rows), "cases": case_rows, "traces": trace_rows,
            "failures": data.get("failures", [])}


def read_collected(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a collection file, refusing anything that is not one (one-line errors)."""
    from optwin.errors import ProfileError

    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ProfileError(f"no collection file at {os.fspath(path)}: run `optwin validate --collect-only FILE`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProfileError(f"{os.fspath(path)} is not a validation collection (invalid JSON: {e})") from None
    if not isinstance(data, dict) or data.get("format") != "optwin-validate-collect":
        raise ProfileError(f"{os.fspath(path)} is not a validation collection (written by `optwin validate --collect-only`)")
    from optwin.validate.collect import FORMAT_VERSION

    if data.get("version") != FORMAT_VERSION:
        raise ProfileError(f"{os.fspath(path)}: collection format version {data.get('version')!r}, this optwin reads "
                           f"{FORMAT_VERSION}: collect again with this optwin")
    _check_records(data, os.fspath(path))
    _check_sketch_contract(data, os.fspath(path))
    return data


def _check_records(data: dict[str, Any], path: str) -> None:
    """Each case and trace call has the collector's form, and each label is one of its op's fault types with a
    bool value: a label of another catalog would be scored as a fault of some kind (any(labels) counts it)."""
    from optwin.catalog import CATALOG
    from optwin.errors import ProfileError

    def bad(where: str, why: str) -> ProfileError:
        return ProfileError(f"{path}: {where}: {why} (not what `optwin validate --collect-only` writes)")

    def outcomes(where: str, op: Any, rec: Any) -> int:
        """Checks one record; returns how many of its outcomes hold labels."""
        if not isinstance(rec, dict) or not isinstance(rec.get("sketch"), dict) or not isinstance(rec.get("outcomes"), dict):
            raise bad(where, "needs a sketch object and an outcomes object")
        if op not in CATALOG:
            raise bad(where, f"unknown operator {op!r}")
        fts = CATALOG[op].fault_types
        n = 0
        for variant, o in rec["outcomes"].items():
            if not isinstance(o, dict):
                raise bad(f"{where}, {variant}", "an outcome must be an object")
            labels = o.get("labels", {})  # none: the run errored (counted apart)
            if not isinstance(labels, dict) or ("labels" in o and not labels):
                raise bad(f"{where}, {variant}", "labels must be an object of fault type -> true/false")
            for ft, v in labels.items():
                if ft not in fts:
                    raise bad(f"{where}, {variant}", f"label {ft!r} is no fault type of {op} ({', '.join(fts)})")
                if not isinstance(v, bool):
                    raise bad(f"{where}, {variant}", f"label {ft} must be true or false, got {v!r:.20}")
            n += bool(labels)
        return n

    for key in ("cases", "traces"):
        if not isinstance(data.get(key, []), list):
            raise bad(key, "must be a list")
    labelled = 0
    for i, c in enumerate(data.get("cases", [])):
        labelled += outcomes(f"case {i}", c.get("op") if isinstance(c, dict) else None, c)
    for i, t in enumerate(data.get("traces", [])):
        if not isinstance(t, dict) or not isinstance(t.get("calls"), list) or not isinstance(t.get("variants"), list):
            raise bad(f"trace {i}", "needs calls and variants lists")
        for j, c in enumerate(t["calls"]):
            labelled += outcomes(f"trace {i} call {j}", t.get("op"), c)
            if isinstance(c.get("t"), bool) or not isinstance(c.get("t"), (int, float)):
                raise bad(f"trace {i} call {j}", "t must be a number of seconds")
    if (data.get("cases") or data.get("traces")) and not labelled:
        raise ProfileError(f"{path}: no outcome holds a label (every run failed?): nothing to score; see its failures")


def _check_sketch_contract(data: dict[str, Any], path: str) -> None:
    """Refuse a collection whose sketches predate features of the current sketch contract."""
    from optwin.errors import ProfileError
    from optwin.ingest.sketch import SKETCH_FEATURES

    sketches = [(c.get("op"), c.get("sketch")) for c in data.get("cases", [])]
    sketches += [(t.get("op"), c.get("sketch")) for t in data.get("traces", []) for c in t.get("calls", [])]
    for op, sk in sketches:  # one that lacks even the first features is a broken record, not an old one
        if op in SKETCH_FEATURES and isinstance(sk, dict) and not any(f in sk for f in SKETCH_FEATURES[op][:3]):
            raise ProfileError(f"{path}: a {op} sketch holds none of {', '.join(SKETCH_FEATURES[op][:3])}: "
                               f"a corrupt record, not an older collection")
    missing = sorted({f for op, sk in sketches if op in SKETCH_FEATURES and isinstance(sk, dict)
                      for f in SKETCH_FEATURES[op] if f not in sk})
    if missing:
        raise ProfileError(f"{path}: its sketches lack {', '.join(missing)} (collected before the feature existed): "
                           f"run `python -m optwin.validate.resketch {path} --out NEW.json` and score NEW.json")


# ----------------------------------------------------------------------------- rendering


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def render(report: dict[str, Any], console: Any = None) -> None:
    """Rich tables: per triple, per drift stream, then the headline."""
    from rich.console import Console
    from rich.table import Table

    if console is None:  # logs and pipes get a wide table instead of rich's 80-column default
        console = Console()
        if not console.is_terminal:
            console = Console(width=170)
    t = Table(title=f"held-out cases vs matcher (build {report.get('build_id') or '?'}, threshold "
                    f"{_f(report.get('threshold'), '.2f')}): AUROC per fault type (positives), warn recall/precision")
    for col in ("op", "variant", "dtype", "n", "nonfinite", "prec_loss", "low_ent", "recall", "precision",
                "Brier", "known"):
        t.add_column(col, justify="left" if col in ("op", "variant", "dtype") else "right")
    for r in report["cases"]:
        cells = []
        for ft in FAULT_ORDER:
            f = r["faults"].get(ft)
            cells.append("n/a" if f is None else f"{_f(f['auroc'])} ({f['positives']})")
        t.add_row(r["op"], r["variant"], r["dtype"], str(r["n"]), *cells, _f(r["warn"]["recall"]),
                  _f(r["warn"]["precision"]), _f(r["brier"]), f"{100 * r['known_frac']:.0f}%")
    console.print(t)
    if report["traces"]:
        tt = Table(title="drift traces (20 calls/s, simulated time; lead: first warning before the first fault, "
                         "held: the episode open at the fault)")
        for col in ("trace", "kind", "variant", "dtype", "fault t", "warn t", "lead s", "held s", "eta@warn",
                    "false (calls/ep)"):
            tt.add_column(col, justify="left" if col in ("trace", "kind", "variant", "dtype") else "right")
        for r in report["traces"]:
            lead = _f(r["lead_s"], ".2f") if not r["missed"] else f"late {_f(r['late_s'], '.2f')}"
            tt.add_row(r["trace"], r["kind"], r["variant"], r["dtype"], _f(r["first_fault_t"], ".2f"),
                       _f(r["first_warn_t"], ".2f"), lead, _f(r["sustained_lead_s"], ".2f"),
                       _f(r["eta_at_first_warn_s"], ".1f"),
                       f"{r['false_alarm_calls']}/{r['false_alarm_episodes']}")
        console.print(tt)
    s = report["summary"]
    console.print(
        f"[bold]{s['cases']}[/bold] case outcomes over {s['triples']} triples: warn recall {_f(s['warn_recall'])}, "
        f"precision {_f(s['warn_precision'])}; AUROC medians "
        + ", ".join(f"{k} {_f(v)}" for k, v in s["auroc_median"].items())
        + f"\ndrift: {s['drift_early_warnings']}/{s['drift_faulting_streams']} drifting streams warned early; "
        f"median lead {_f(s['lead_s_median'], '.2f')} s over the {s.get('lead_streams', '?')} faulting streams "
        "warned by their first fault (on it: lead 0); flat controls: "
        f"{s['flat_false_alarm_calls']} false-alarm calls, {s['flat_false_alarm_episodes']} episodes "
        f"over {s['flat_streams']} streams"
        + (f"; {s['flat_streams_with_faults']} flat control(s) faulted, {s['flat_faults_unwarned']} without a "
           "warning before" if s["flat_streams_with_faults"] else "")
    )
    if report.get("failures"):
        console.print(f"[yellow]{len(report['failures'])} device failures recorded[/yellow] "
                      f"(first: {report['failures'][0].get('error')})")
