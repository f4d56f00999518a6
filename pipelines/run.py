"""Entry point: `python pipelines/run.py --config pipelines/configs/<name>.yaml [key=value ...]`,
the same as the installed `rltf-ray` command (rltf_ray/cli.py).

Runs on a Ray started in-process unless RAY_ADDRESS names a cluster (as under `ray job submit`).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a checkout without `pip install`

from rltf_ray.cli import run_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_main())
