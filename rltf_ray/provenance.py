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
    from it; None outside a checkout of this library (an installed wheel, a job's working_dir
    upload). An installed package lives in site-packages, which may sit inside the user's own
    repository (a `.venv` in it): that repository's commit says nothing about this code, so
    only a checkout whose top level is the library's own root counts."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != Path(root).resolve():
            return None
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def package_version() -> str | None:
    """The installed rltf_ray's version (None when it runs from a folder never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rltf_ray")
    except PackageNotFoundError:
        return None


def provenance(cfg, precision) -> dict:
    """The run's provenance record (`cfg`: the resolved Config; `precision`: its resolved
    `rltf_ray.precision.Precision`)."""
    return {"version": package_version(), "commit": git_commit(), **precision.record(),
            "lr": cfg.trainer.lr, "loss": dataclasses.asdict(cfg.loss),
            "model_dtype_setting": cfg.model.dtype}
