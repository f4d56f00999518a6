"""Compare objective presets at equal budgets, over seeds, with standard errors.

    rltf-ray compare --config pipelines/configs/demo.yaml \\
        --presets grpo_single,grpo_multi,rltf_sd,rltf_fm,rltf_sd_fm --seeds 3 --name NAME [key=value ...]

(`python pipelines/compare.py` in a checkout.)

Every (preset, seed) run gets the same config and overrides apart from the preset, and
`run.seed = seed`: for one seed every preset sees the same prompts in the same order at the
same number of first-turn samples (prompts_per_step x n x steps), and every run is scored on
the same held-out problems. Outputs under `results/NAME/`: `runs/<preset>_s<seed>/` (each
run's own output folder), `runs.jsonl` (every number), `table.md`, `runs.md` (one row per run),
`paired.md` (each preset minus --baseline, paired by seed: mean, SE, t, per-seed values, and
the same along the way) and `curves.png`, rewritten
after every finished run; `rltf-ray report results/NAME` rebuilds them from the run
folders' metrics.jsonl and summary.json alone (what --git-commit commits).
A finished run (its summary.json exists) is not run again, so a stopped comparison resumes;
nor is a run that the dead-critic guard stopped (its stopped.json exists), which the report
lists as stopped while the comparison goes on with the others.
A finished local run's resume state (`ray_train/`) is deleted unless --keep-resume-state.

Locally the runs go one after another, each as its own `rltf-ray run` process (a fresh
in-process Ray), from the current directory. With `--cluster ADDRESS` (or RAY_ADDRESS set) each run is submitted as a
Ray job to that cluster, all at once; the cluster schedules them in parallel.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rltf_ray.config import ConfigError
from rltf_ray.errors import DEAD_CRITIC_EXIT, STOPPED_FILE
from rltf_ray.loading import load_config
from rltf_ray.provenance import ROOT, git_commit
from rltf_ray.report import write_report

RUN = [sys.executable, "-m", "rltf_ray.cli", "run"]  # the installed `rltf-ray run`, from any folder


def run_args(args, preset: str, seed: int, out: Path) -> list[str]:
    plugins = [a for p in args.plugin for a in ("--plugin", p)]
    return ["--config", args.config, "--preset", preset, *plugins, f"run.seed={seed}",
            f"run.output_dir={out}", *args.overrides]


def run_env() -> dict:
    """The runs' environment: this one, with the library importable from any folder (a
    checkout that was never installed has it only on this process's sys.path)."""
    import os

    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), path]))}


def run_local(args, preset: str, seed: int, out: Path) -> None:
    log = out.parent / f"{out.name}.log"
    cmd = [*RUN, *run_args(args, preset, seed, out)]
    print(f"[compare] {preset} seed {seed}: running (log {log})", flush=True)
    t = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=run_env()).returncode
    if rc == DEAD_CRITIC_EXIT and stopped_by_guard(preset, seed, out):
        drop_resume_state(args, out)
        return
    if rc != 0:
        tail = log.read_text()[-2000:]
        raise SystemExit(f"[compare] {preset} seed {seed} failed (exit {rc}); end of {log}:\n{tail}")
    print(f"[compare] {preset} seed {seed}: done in {time.perf_counter() - t:.0f}s", flush=True)
    drop_resume_state(args, out)


def stopped_by_guard(preset: str, seed: int, out: Path) -> bool:
    """Whether a failed run was stopped by the dead-critic guard (its STOPPED_FILE): such a
    run is reported as stopped (runs.md), the comparison goes on, and it is not made again."""
    if not (out / STOPPED_FILE).is_file():
        return False
    why = json.loads((out / STOPPED_FILE).read_text())["error"]
    print(f"[compare] {preset} seed {seed}: STOPPED by the dead-critic guard: {why}", flush=True)
    return True


def drop_resume_state(args, out: Path) -> None:
    resume_state = out / "ray_train"
    if not args.keep_resume_state and resume_state.is_dir():
        # A finished run needs no resume state, and it is the bulk of a run's disk (2.1 GB of
        # DeepSpeed optimizer state for SmolLM2): fifteen runs of it filled this machine's disk.
        # The trained model stays in checkpoints/.
        shutil.rmtree(resume_state)


def run_cluster(args, todo: list[tuple[str, int, Path]], address: str) -> None:
    """One Ray job per run; the output folders must be on storage the cluster shares."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    # a checkout ships itself (the nodes import the library from it); an installed package must
    # be installed on the nodes, and the current folder (configs, plugins, data) is shipped
    here = ROOT if git_commit(ROOT) is not None else Path.cwd()
    env = {"working_dir": str(here), "excludes": [".venv", ".git", "outputs", "results"]}
    jobs, out_of = {}, {}
    for preset, seed, out in todo:
        entry = " ".join(["python", "-m", "rltf_ray.cli", "run", *run_args(args, preset, seed, out)])
        job_id = client.submit_job(entrypoint=entry, runtime_env=env)
        jobs[job_id], out_of[job_id] = (preset, seed), out
        print(f"[compare] submitted {preset} seed {seed}", flush=True)
    while jobs:
        time.sleep(10)
        for job_id, (preset, seed) in list(jobs.items()):
            status = client.get_job_status(job_id)
            if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                del jobs[job_id]
                print(f"[compare] {preset} seed {seed}: {status}", flush=True)
                if status != JobStatus.SUCCEEDED and not stopped_by_guard(preset, seed, out_of[job_id]):
                    raise SystemExit(client.get_job_logs(job_id)[-2000:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rltf-ray compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--presets", required=True, help="comma-separated preset names")
    ap.add_argument("--seeds", type=int, default=3, help="how many seeds")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds run from here (to add seeds whose earlier runs live elsewhere)")
    ap.add_argument("--name", required=True, help="results/NAME/")
    ap.add_argument("--variant", default="",
                    help="an arm of one comparison run under other overrides: its runs go to "
                         "runs/<preset>.<variant>_s<seed>/ and are paired with the baseline's runs of the "
                         "same variant (records carry `variant`)")
    ap.add_argument("--results", default="results", help="where results/NAME/ goes (default ./results)")
    ap.add_argument("--cluster", help="Ray address to submit the runs to as jobs (else RAY_ADDRESS)")
    ap.add_argument("--keep-resume-state", action="store_true",
                    help="keep each finished run's ray_train/ folder (DeepSpeed state), deleted by default")
    ap.add_argument("--baseline", default="grpo_single",
                    help="the preset the others are compared with, paired by seed (paired.md)")
    ap.add_argument("--git-commit", action="store_true",
                    help="commit each finished run's metrics.jsonl and summary.json (and runs.jsonl) at once")
    ap.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE",
                    help="a module (import name or .py path) with your tasks or critics; repeatable")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = ap.parse_args(argv)
    presets = [p for p in args.presets.split(",") if p]
    try:  # every run's config must load before anything starts
        for p in presets:
            load_config(args.config, args.overrides, preset=p, plugins=args.plugin)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.seeds < 1 or args.first_seed < 0:
        print("--seeds must be >= 1 and --first-seed >= 0", file=sys.stderr)
        return 2
    root = Path(args.results).resolve() / args.name  # absolute: a cluster's jobs run in other folders
    (root / "runs").mkdir(parents=True, exist_ok=True)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    if args.variant and not args.variant.replace("-", "").isalnum():
        print(f"--variant: letters, digits and '-' only, got {args.variant!r}", file=sys.stderr)
        return 2
    arm = f".{args.variant}" if args.variant else ""
    plan = [(p, s, root / "runs" / f"{p}{arm}_s{s}") for s in seeds for p in presets]
    todo = [(p, s, out) for p, s, out in plan
            if not (out / "summary.json").is_file() and not (out / STOPPED_FILE).is_file()]
    print(f"[compare] {len(plan)} runs, {len(plan) - len(todo)} already finished", flush=True)
    import os

    address = args.cluster or os.environ.get("RAY_ADDRESS")
    title = f"{args.name}: {args.config} {' '.join(args.overrides)}"
    baseline = args.baseline if args.baseline in presets else None
    if address and todo:
        run_cluster(args, todo, address)
    for p, s, out in ([] if address else todo):
        run_local(args, p, s, out)
        write_report(root, title, baseline)  # after every run: runs.jsonl holds what has finished
        if args.git_commit:
            how = "stopped by the dead-critic guard" if (out / STOPPED_FILE).is_file() else "finished"
            commit_run(root, out, f"results/{args.name}: {p}{arm} seed {s} {how}")
    print(write_report(root, title, baseline))
    print(f"[compare] results in {root}")
    return 0


def commit_run(root: Path, out: Path, message: str) -> None:
    """Commit a finished run's data (and the updated runs.jsonl) at once, and nothing else:
    an interrupted comparison never loses a finished run."""
    paths = [str(p.resolve()) for p in (root / "runs.jsonl", out / "metrics.jsonl", out / "summary.json",
                                        out / STOPPED_FILE) if p.is_file()]
    for attempt in range(5):  # another git command may hold the index lock for a moment
        # in the repository that holds the results, whichever that is
        add = subprocess.run(["git", "add", "-f", *paths], cwd=root, capture_output=True, text=True)
        done = add.returncode == 0 and subprocess.run(
            ["git", "commit", "-q", "-m", message, "--", *paths], cwd=root, capture_output=True,
            text=True).returncode == 0
        if done:
            print(f"[compare] committed: {message}", flush=True)
            return
        time.sleep(3)
    print(f"[compare] WARNING: could not commit {paths} ({add.stderr.strip()}); the files are on disk, "
          "commit them by hand", flush=True)
