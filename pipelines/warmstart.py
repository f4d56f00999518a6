"""`rltf-ray warmstart` in a checkout: `python pipelines/warmstart.py ...` (rltf_ray/commands/warmstart.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a checkout without `pip install`
from rltf_ray.commands.warmstart import *  # noqa: E402,F401,F403
from rltf_ray.commands.warmstart import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
