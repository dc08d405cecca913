"""Fill in sketch features a label collection predates, from the same seeded inputs, on this CPU.

    python -m optwin.validate.resketch validate_gpu.json --out validate_gpu.resketched.json

A collection (optwin.validate.collect) stores the sketch each call had on the device. When the
sketch contract later gains a feature (softmax/attention `peaked_frac`), the old labels are still
good (they are the device's outputs) but their sketches lack the feature, and a database built with
it as a region feature cannot place them. Every held-out case and drift call is reproducible from
(op, dtype, case index, seed) or (trace, kind, seed), so the missing features are computed here from
the regenerated inputs with optwin.ingest.sketch on the CPU (its float64 reference path, the one
CUDA runs). Features the device measured are kept as they are; the file records which features were
filled in and where (`resketched`). Regenerated inputs are checked against the stored sketch's
absmax, so a collection from a different generator version is refused instead of mislabelled.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import torch

from optwin.catalog import operator
from optwin.errors import InputError
from optwin.ingest.sketch import SKETCH_FEATURES, sketch_tensor
from optwin.validate.collect import write_collected
from optwin.validate.drift import TRACES, trace_inputs
from optwin.validate.families import held_out_case


def _cpu_sketch(op: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, float]:
    names, values = sketch_tensor(op, inputs, params, exact=True)
    return dict(zip(names, values.tolist()))


# Features whose definition changed when another was added: a sketch without the new feature (key)
# was taken under the old definition of these, so they are replaced along with it. layernorm's
# max_mean_over_std left the exactly constant rows to const_absmax (stop 12): an old sketch holds the
# 1e30 cap for any input with a constant row.
REDEFINED: dict[str, tuple[str, tuple[str, ...]]] = {"layernorm": ("const_absmax", ("max_mean_over_std",))}


def _fill(op: str, stored: dict[str, float], fresh: dict[str, float], where: str) -> list[str]:
    """Add fresh's features missing from stored (in place), and replace the ones REDEFINED with them;
    refuse when the inputs differ."""
    a, b = stored.get("absmax"), fresh["absmax"]
    if a is not None and not math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-30):
        raise InputError(f"{where}: regenerated inputs do not match the collection (absmax {b:.6g} vs stored "
                         f"{a:.6g}): it was drawn by another generator version; collect it again")
    added = [f for f in SKETCH_FEATURES[op] if f not in stored]
    new, old_defs = REDEFINED.get(op, ("", ()))
    replaced = [f for f in old_defs if new in added]
    for f in added + replaced:
        stored[f] = fresh[f]
    return added + replaced


def resketch(data: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """The collection with every sketch completed to the current contract; (data, features added)."""
    added: set[str] = set()
    seed = int(data.get("seed", 0))
    for rec in data.get("cases", []):
        op = operator(rec["op"]).name
        if all(f in rec["sketch"] for f in SKETCH_FEATURES[op]):
            continue
        case = held_out_case(op, rec["dtype"], int(rec["case"]), seed)
        added.update(_fill(op, rec["sketch"], _cpu_sketch(op, case.inputs, case.params), f"{op}/{rec['dtype']} case {rec['case']}"))
    specs = {s.name: s for s in TRACES}
    for tr in data.get("traces", []):
        spec = specs.get(tr["name"])
        if spec is None:
            raise InputError(f"trace {tr['name']!r} is not one of this optwin's drift traces")
        if all(all(f in c["sketch"] for f in SKETCH_FEATURES[spec.op]) for c in tr["calls"]):
            continue
        calls = trace_inputs(spec, tr["kind"], seed, max(c["i"] for c in tr["calls"]) + 1)
        for c in tr["calls"]:
            inputs, params = calls[c["i"]]
            added.update(_fill(spec.op, c["sketch"], _cpu_sketch(spec.op, inputs, params), f"trace {tr['name']}/{tr['kind']} call {c['i']}"))
    if added:
        data["resketched"] = {"features": sorted(added | set(data.get("resketched", {}).get("features", []))),
                              "device": "cpu", "by": "optwin.validate.resketch"}
    return data, added


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m optwin.validate.resketch", description=__doc__.splitlines()[0])
    ap.add_argument("labels", help="a collection written by optwin.validate.collect")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        with open(a.labels) as f:
            data = json.load(f)
        data, added = resketch(data)
    except (OSError, ValueError, KeyError, InputError) as e:
        print(f"error: {a.labels}: {e}", file=sys.stderr)
        return 2
    write_collected(data, a.out)
    print(f"wrote {a.out}: added {', '.join(sorted(added)) or 'nothing (already complete)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
