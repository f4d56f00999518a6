"""`rltf-ray plot` in a checkout: `python pipelines/plot.py ...` (rltf_ray/commands/report.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a checkout without `pip install`
from rltf_ray.commands.report import plot_main as main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
