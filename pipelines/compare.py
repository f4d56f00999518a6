"""`rltf-ray compare` in a checkout: `python pipelines/compare.py ...` (rltf_ray/commands/compare.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a checkout without `pip install`
from rltf_ray.commands.compare import *  # noqa: E402,F401,F403
from rltf_ray.commands.compare import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
