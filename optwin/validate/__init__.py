"""Validation against real device runs: held-out inputs, GPU fault labels, matcher scores, drift traces.

    optwin validate --db fingerprints.duckdb --device cuda --json validate.json

Split in two so the GPU machine needs only torch and numpy:
- `collect` (GPU side, optwin.validate.collect): held-out cases (optwin.validate.families) and drift
  traces (optwin.validate.drift) run on the device, sketched and labelled; written as JSON.
- `score` (CPU side, optwin.validate.score): the matcher's verdicts on those sketches against the
  labels: AUROC per fault type, recall/precision of `warn`, Brier score, lead times, false alarms.
Importing this package imports nothing (submodules load on use).
"""
