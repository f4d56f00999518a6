"""Runs that come and go on one shared Ray cluster, as on a team's cluster: a run killed
mid-run while another trains, the killed one resumed, a new run that takes the name of a
dead run's critic app, and two Tune trials of which one is stopped early. Every run that
finished trained on its own critic's critiques only; no app of a dead or stopped run is left
a minute after its end; no app of a live run is ever deleted."""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import critic_plugin, head_node, stop_head

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "pipelines" / "configs" / "tiny.yaml")
GCS_PORT, DASHBOARD_PORT = 6393, 8278
SMALL = ["run.eval_before_after=false", "trainer.num_workers=1", "pipeline.prompts.prompts_per_step=2"]
TUNE = """
import sys
import rltf_ray
from ray import tune

config = (rltf_ray.RLTFConfig.from_yaml(sys.argv[1]).plugins(sys.argv[2])
          .node("critic", critic="critic_t").override(*sys.argv[4:]).run(steps=2))


def stop(trial_id, result):  # the first trial is stopped early, after one step
    return result["config"]["trainer.lr"] == 0.0 and result["step"] >= 0


tuner = tune.Tuner(rltf_ray.tune_trainable(config), param_space={"trainer.lr": tune.grid_search([0.0, 1e-3])},
                   tune_config=tune.TuneConfig(max_concurrent_trials=2),
                   run_config=tune.RunConfig(storage_path=sys.argv[3], name="churn", stop=stop))
results = tuner.fit()
print("TRIALS", len(results), "ERRORS", len(results.errors))
"""


class AppWatch(threading.Thread):
    """Serve's app names over time, as an operator polling the cluster would see them."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen: list[tuple[float, set]] = []
        self.done = threading.Event()

    def run(self):
        from ray import serve

        while not self.done.is_set():
            try:
                self.seen.append((time.time(), set(serve.status().applications)))
            except Exception:  # noqa: BLE001 - Serve not started yet
                pass
            time.sleep(0.5)

    def gaps(self, app: str, start: float, end: float) -> int:
        """Polls within (start, end) that did not see `app`: a live run's app deleted."""
        return sum(app not in apps for t, apps in self.seen if start < t < end)


def app_of(log: Path) -> str:
    """The run's critic app name, as its log says it deployed it."""
    found = re.findall(r"critic app '([^']+)' ready", log.read_text())
    assert found, log.read_text()[-2000:]
    return found[-1]


def start(cmd: list[str], log: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                            start_new_session=True)  # its own process group: killed whole


def own_critiques(out: Path, name: str) -> None:
    import pyarrow.parquet as pq

    for f in sorted((out / "rollouts").glob("step_*.parquet")):
        got = {r["critique"] for r in pq.read_table(f).to_pylist() if r["revised"]}
        assert got <= {f"from {name}"}, (out, got)


def test_runs_that_die_restart_and_share_names_never_touch_each_others_critic(tmp_path):
    import ray

    env = head_node(GCS_PORT, DASHBOARD_PORT)
    address = f"127.0.0.1:{GCS_PORT}"
    env["RAY_ADDRESS"] = address  # every run joins the cluster, as under `ray job submit`
    run = [sys.executable, "-m", "rltf_ray.cli", "run"]
    for name in ("critic_a", "critic_b", "critic_c", "critic_t"):
        (tmp_path / f"{name}.py").write_text(critic_plugin(name, f"'from {name}'"))

    def args(name: str, out: Path, *more: str) -> list[str]:
        return [*run, "--config", TINY, "--plugin", str(tmp_path / f"{name}.py"), f"pipeline.critic.critic={name}",
                f"run.output_dir={out}", *SMALL, *more]

    watch, ends, kills = AppWatch(), {}, 0
    try:
        ray.init(address=address, logging_level="ERROR")
        watch.start()
        a_out, b_out = tmp_path / "a", tmp_path / "b"
        a = start(args("critic_a", a_out, "run.steps=4", "run.checkpoint_every=1"), tmp_path / "a.log", env)
        b = start(args("critic_b", b_out, "run.steps=3"), tmp_path / "b.log", env)
        deadline = time.time() + 600
        while not (a_out / "checkpoints" / "step_1").is_dir() and a.poll() is None and time.time() < deadline:
            time.sleep(1)
        assert a.poll() is None, (tmp_path / "a.log").read_text()[-2000:]
        a_app = app_of(tmp_path / "a.log")
        os.killpg(a.pid, signal.SIGKILL)  # mid-run, while B trains
        a.wait()
        kills, ends[a_app] = kills + 1, time.time()
        assert b.wait(timeout=900) == 0, (tmp_path / "b.log").read_text()[-3000:]
        ends[app_of(tmp_path / "b.log")] = time.time()
        # A again, on its own folder; then C under the name A's dead run held
        a2 = start([*run, "--resume", str(a_out)], tmp_path / "a2.log", env)
        assert a2.wait(timeout=900) == 0, (tmp_path / "a2.log").read_text()[-3000:]
        ends[app_of(tmp_path / "a2.log")] = time.time()
        c = start(args("critic_c", tmp_path / "c", "run.steps=1", f"pipeline.critic.app_name={a_app}"),
                  tmp_path / "c.log", env)
        assert c.wait(timeout=900) == 0, (tmp_path / "c.log").read_text()[-3000:]
        assert app_of(tmp_path / "c.log") == a_app
        (tmp_path / "tune.py").write_text(TUNE)
        t = start([sys.executable, str(tmp_path / "tune.py"), TINY, str(tmp_path / "critic_t.py"),
                   str(tmp_path / "tune"), *SMALL], tmp_path / "tune.log", env)
        assert t.wait(timeout=900) == 0, (tmp_path / "tune.log").read_text()[-3000:]
        assert "TRIALS 2 ERRORS 0" in (tmp_path / "tune.log").read_text()
        ends["tune"] = time.time()
        deadline = time.time() + 60  # a minute after the last end: nothing of any run is left
        while time.time() < deadline and [x for x in watch.seen[-1][1] if x.startswith("rltf_critic") or x == a_app]:
            time.sleep(1)
        leaked = [x for x in watch.seen[-1][1] if x.startswith("rltf_critic") or x == a_app]
    finally:
        watch.done.set()
        ray.shutdown()
        stop_head(GCS_PORT)
    # A's app went within a minute of its kill, before C took its name
    a_gone = min((t for t, apps in watch.seen if t > ends[a_app] and a_app not in apps), default=None)
    assert a_gone is not None and a_gone - ends[a_app] < 60
    # each live run's app was there from its first sight until its last step's metrics
    # (its own stop() deletes it after that); A's until it was killed
    live = {}  # run: (its app, first seen, end of its use)
    for log, out in (("b.log", b_out), ("a2.log", a_out), ("c.log", tmp_path / "c")):
        app = app_of(tmp_path / log)
        # C's app has the name A's had: C's is the one seen after A's went
        first = min(t for t, apps in watch.seen if app in apps and t > (a_gone if log == "c.log" else 0))
        live[log] = (app, first, (out / "metrics.jsonl").stat().st_mtime)
    live["a.log"] = (a_app, min(t for t, apps in watch.seen if a_app in apps), ends[a_app] - 1)
    gaps = {run: watch.gaps(*span) for run, span in live.items()}
    wrongly = sum(gaps.values())
    (tmp_path / "apps_seen.txt").write_text("".join(f"{t:.1f} {sorted(apps)}\n" for t, apps in watch.seen))
    for out, name in ((b_out, "critic_b"), (a_out, "critic_a"), (tmp_path / "c", "critic_c")):
        own_critiques(out, name)
    for trial in (tmp_path / "tune" / "churn").glob("*/rltf"):
        own_critiques(trial, "critic_t")
    print(f"churn: 6 runs (A killed and resumed, B, C, 2 Tune trials), {kills} kill, {len(leaked)} apps leaked, "
          f"{wrongly} polls without a live run's app")
    assert leaked == [] and wrongly == 0, (gaps, live, tmp_path / "apps_seen.txt")
