"""`rltf-ray report` and `rltf-ray plot`: a comparison's tables and a run's curves, rebuilt
from the committed files alone (summary.json and metrics.jsonl).

    rltf-ray report results/NAME [--baseline grpo_single]
    rltf-ray plot OUTPUT_DIR [--out curves.png]

`report` reads results/NAME/runs/<preset>_s<seed>/{summary.json,metrics.jsonl} (the files a
comparison commits) and writes runs.jsonl, table.md, runs.md (one row per run: its curve and
step times), paired.md (paired by seed, at the end and along the way) and curves.png beside
them. `plot` draws one run's rewards, accuracies, losses and step time from its metrics.jsonl.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def report_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rltf-ray report", description="Rebuild a comparison's tables and curves.")
    ap.add_argument("root", help="results/NAME")
    ap.add_argument("--baseline", default="grpo_single")
    args = ap.parse_args(argv)
    from rltf_ray.report import write_report

    if not Path(args.root, "runs").is_dir():
        print(f"report: {args.root}/runs does not exist", file=sys.stderr)
        return 2
    print(write_report(Path(args.root), title=Path(args.root).name, baseline=args.baseline))
    return 0


def plot_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rltf-ray plot", description="Plot a run's learning curves.")
    ap.add_argument("output_dir")
    ap.add_argument("--out", help="PNG path (default OUTPUT_DIR/curves.png)")
    args = ap.parse_args(argv)
    from rltf_ray.report import write_run_plots

    out = Path(args.out or Path(args.output_dir) / "curves.png")
    try:
        drawn = write_run_plots(Path(args.output_dir), out)
    except ValueError as e:
        print(f"plot: {e}", file=sys.stderr)
        return 2
    print(f"{out}: {', '.join(drawn)}")
    return 0
