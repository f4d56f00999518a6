"""What an idle embedded pipeline costs the machine: the CPU that Ray's own processes and
rltf_ray's idle actors take while nothing is generated or trained.

    .venv/bin/python benchmarks/bench_ray_idle.py [--seconds 20] [--variants default,no_dashboard,...]

Each variant starts the tiny config's pipeline (critic app, engine, broker, two DeepSpeed
workers) in a process of its own, waits until the learner is up and idle, then reads every
process's CPU time from /proc over --seconds and prints the total and the largest users.
On this 2-core machine that load is what the engine's two OpenMP threads share their cores
with (`bench_engine_host.py --background` measures what such a load costs generation)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import choose  # noqa: E402

# name -> environment
VARIANTS = {
    "default": {},  # ray_start.EMBEDDED_RAY_ENV: Serve's control loop every 1 s
    "serve_loop_0.1s": {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1"},  # Ray's default; EMBEDDED_RAY_ENV sets 1 s
    # Ray's own periodic reports: task events (the dashboard's task view) every 1 s and the
    # raylet's resource view every 0.1 s by default.
    "slower_reports": {"RAY_task_events_report_interval_ms": "10000",
                       "RAY_raylet_report_resources_period_milliseconds": "1000"},
}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_by_process() -> dict[int, tuple[str, float]]:
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(d.name)] = (cmd or stat[stat.index("(") + 1:stat.rindex(")")], (int(fields[11]) + int(fields[12])) / TICK)
    return out


def short(cmd: str) -> str:
    for key in ("ray::", "dashboard/agent", "dashboard.py", "log_monitor", "monitor.py", "gcs_server", "raylet",
                "default_worker", "runtime_env"):
        if key in cmd:
            i = cmd.index(key)
            return cmd[i:i + 48].split(" ")[0] if key == "ray::" else key
    return cmd[:48]


def one(variant: str, seconds: float) -> None:
    os.environ.update(VARIANTS[variant])
    from rltf_ray.loading import load_config
    from rltf_ray.runner import Pipeline

    cfg = load_config(str(ROOT / "pipelines/configs/tiny.yaml"),
                      [f"run.output_dir=/tmp/rltf_idle_{variant}", "run.tensorboard=false"])
    pipe = Pipeline(cfg)
    pipe.start()
    pipe.wait_start()
    time.sleep(10)  # let start-up work (imports, compiles, first reports) finish
    me = os.getpid()
    before = cpu_by_process()
    time.sleep(seconds)
    after = cpu_by_process()
    used = {}
    for pid, (cmd, t) in after.items():
        if pid != me and pid in before:
            name = short(cmd)
            used[name] = used.get(name, 0.0) + (t - before[pid][1]) / seconds * 100
    driver = (after[me][1] - before[me][1]) / seconds * 100
    top = sorted(used.items(), key=lambda kv: -kv[1])
    print("RESULT", f"{sum(used.values()) + driver:.1f}", f"{driver:.1f}",
          f"{sum(v > 0 for v in used.values())} names busy:", "; ".join(f"{k} {v:.1f}" for k, v in top[:8] if v >= 0.5))
    pipe.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--only", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.only:
        one(a.only, a.seconds)
        return 0
    names = choose(ap, "--variants", a.variants, VARIANTS)
    print(f"\nidle embedded pipeline (tiny config), CPU over {a.seconds:.0f} s, % of one core, {os.cpu_count()} cores")
    print("| variant | all processes | driver | largest users |\n| --- | --- | --- | --- |")
    for name in names:
        got = subprocess.run([sys.executable, __file__, "--seconds", str(a.seconds), "--only", name],
                             capture_output=True, text=True)
        subprocess.run(["ray", "stop", "--force"], capture_output=True)
        line = [x for x in got.stdout.splitlines() if x.startswith("RESULT")]
        if got.returncode or not line:
            print(f"| {name} | failed (exit {got.returncode}): {got.stderr.strip().splitlines()[-1:]} | - | - |")
            continue
        total, driver, top = line[0].split(" ", 3)[1:]
        print(f"| {name} | {total} | {driver} | {top} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
