"""The deterministic twin against a label collection's GPU outputs, case by case: how often the emulated relative
error is the GPU's to 1e-9 (the same output, near enough bit for bit) and how often the fault flags agree.

    python bench/twin_vs_labels.py bench/results/validate_gpu_h200_seed4.json layernorm:one-pass rmsnorm:fp32-acc

Each held-out case is regenerated from (op, dtype, case, seed) (optwin.validate.families.held_out_case).
"""

from __future__ import annotations

import argparse
import collections
import json
import math

from optwin import twin
from optwin.validate.families import held_out_case


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("labels")
    ap.add_argument("triples", nargs="+", help="op:variant pairs")
    args = ap.parse_args()
    want = {tuple(t.split(":")) for t in args.triples}
    data = json.load(open(args.labels))
    count: collections.Counter = collections.Counter()
    for c in data["cases"]:
        for variant, out in c["outcomes"].items():
            if (c["op"], variant) not in want or "labels" not in out:
                continue
            case = held_out_case(c["op"], c["dtype"], int(c["case"]), int(data["seed"]))
            r = twin.run(c["op"], variant, c["dtype"], case.inputs, case.params)
            gpu = math.inf if out["rel_error"] is None else out["rel_error"]
            same = (gpu == r.rel_error or (math.isfinite(gpu) and abs(gpu - r.rel_error) <= 1e-9 * abs(gpu))
                    or not (math.isfinite(gpu) or math.isfinite(r.rel_error)))
            key = (c["op"], variant, c["dtype"])
            count[key + ("same",)] += same
            count[key + ("flags",)] += any(r.faults.values()) == any(out["labels"].values())
            count[key + ("n",)] += 1
    print(f"{data.get('device_name')}, torch {data.get('torch')}\n")
    print("| op | variant | dtype | relative error the GPU's | fault flags agree | cases |")
    print("|---|---|---|---:|---:|---:|")
    for key in sorted({k[:3] for k in count}):
        print(f"| {' | '.join(key)} | {count[key + ('same',)]} | {count[key + ('flags',)]} | {count[key + ('n',)]} |")


if __name__ == "__main__":
    main()
