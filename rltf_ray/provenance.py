"""What a run was: the code (git commit), the precisions the sampler and the learner ran at,
the resolved loss and the learning rate. Written into summary.json and lifted into every
record of a comparison's runs.jsonl, so that a table can say what its runs measured."""
from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git_commit(root: Path = ROOT) -> str | None:
    """HEAD of the checkout the library runs from, with '-dirty' when tracked files differ
    from it; None outside a git checkout (an installed wheel, a job's working_dir upload)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def provenance(cfg, precision) -> dict:
    """The run's provenance record (`cfg`: the resolved Config; `precision`: its resolved
    `rltf_ray.precision.Precision`)."""
    return {"commit": git_commit(), **precision.record(),
            "lr": cfg.trainer.lr, "loss": dataclasses.asdict(cfg.loss),
            "model_dtype_setting": cfg.model.dtype}
