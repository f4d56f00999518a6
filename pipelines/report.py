"""Rebuild a comparison's tables and curves from its run folders alone.

    python pipelines/report.py results/NAME [--baseline grpo_single]

Reads results/NAME/runs/<preset>_s<seed>/{summary.json,metrics.jsonl} (the files a
comparison commits) and writes runs.jsonl, table.md, runs.md (one row per run: its curve and
step times), paired.md (paired by seed, at the end and along the way) and curves.png beside them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="results/NAME")
    ap.add_argument("--baseline", default="grpo_single")
    args = ap.parse_args(argv)
    from rltf_ray.report import write_report

    if not Path(args.root, "runs").is_dir():
        print(f"report: {args.root}/runs does not exist", file=sys.stderr)
        return 2
    print(write_report(Path(args.root), title=Path(args.root).name, baseline=args.baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
