"""Draw a run's learning curves (rewards, accuracies, losses, step time) to a PNG.

    python pipelines/plot.py OUTPUT_DIR [--out curves.png]

Reads OUTPUT_DIR/metrics.jsonl; the picture goes to OUTPUT_DIR/curves.png by default. The
drawing code is shared with pipelines/compare.py (rltf_ray/report.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Plot a run's learning curves.")
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


if __name__ == "__main__":
    sys.exit(main())
