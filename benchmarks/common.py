"""What the pipeline benchmarks share: run a config in a fresh process and read its metrics."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_pipeline(config: str, overrides: list[str], preset: str | None = None, prefix: str = "rltf_bench_",
                 quiet: bool = False, env: dict | None = None) -> list[dict]:
    """`pipelines/run.py` in its own process (so every run starts and stops its own Ray, engines
    and learner, or joins the Ray that `env`'s RAY_ADDRESS names) into a fresh folder, without
    the before/after evaluations; its metrics rows. `env` adds to this process's environment.
    The folder is deleted afterwards: its resume state alone is 2.6 GB for SmolLM2."""
    out = tempfile.mkdtemp(prefix=prefix)
    cmd = [sys.executable, str(ROOT / "pipelines/run.py"), "--config", config, f"run.output_dir={out}",
           "run.eval_before_after=false", "run.tensorboard=false", *overrides]
    subprocess.run(cmd + (["--preset", preset] if preset else []), cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL if quiet else None, env={**os.environ, **(env or {})})
    try:
        return [json.loads(x) for x in Path(out, "metrics.jsonl").read_text().splitlines()]
    finally:
        shutil.rmtree(out, ignore_errors=True)


def mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / max(len(rows), 1)


def choose(ap: argparse.ArgumentParser, flag: str, value: str, allowed) -> list[str]:
    """A comma list of names from `allowed`, or the parser's error naming them."""
    names = [x for x in value.split(",") if x]
    if not names or set(names) - set(allowed):
        ap.error(f"{flag}: choose from {', '.join(allowed)} (got {value!r})")
    return names


def config_args(doc: str, steps: int) -> argparse.ArgumentParser:
    """--config, --steps and key=value overrides, as every pipeline benchmark takes them."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--config", default="pipelines/configs/tiny.yaml")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("overrides", nargs="*", help="key=value config overrides")
    return ap
