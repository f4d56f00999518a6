"""Ray for a run: joined where one runs (RAY_ADDRESS, a notebook's, a job's), else started
in-process with the settings a small machine needs."""
from __future__ import annotations

import os

from rltf_ray.config import Config
from rltf_ray.console import log
from rltf_ray.plugins import worker_runtime_env


# Settings for a Ray started in-process (the test suite's Ray takes them too); an environment
# variable already set wins.
EMBEDDED_RAY_ENV = {
    # On a small, saturated machine Serve's HTTP proxy can take longer than its default 10 s
    # health-check and 5 s readiness timeouts to answer (or to start), and is then killed;
    # give it a minute.
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    # The controller reconciles every 0.1 s by default: 4% of a core while a run is idle, and
    # an engine whose two OpenMP threads share two cores with such a load slows by far more
    # than its share (docs/benchmarks.md). Once a second is enough for one critic app, whose
    # autoscaler waits tens of seconds before it scales anyway.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1.0",
}


def apply_embedded_ray_env() -> None:
    """Put EMBEDDED_RAY_ENV (and no token auth) into this process's environment, for a Ray it
    is about to start; a variable already set wins. Ray's processes inherit it."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    for k, v in EMBEDDED_RAY_ENV.items():
        os.environ.setdefault(k, v)


def init_ray(cfg: Config) -> bool:
    """Join RAY_ADDRESS / an existing runtime, or start Ray in-process. True if we started it.
    In-process, the job's runtime_env carries the config's plugins to every worker. A joined
    Ray (a submitted job) keeps its job's runtime_env as it is: the plugins then reach each
    worker through the runtime_env it is started with (`Services.runtime_env`, laid over the
    job's), so a job's own py_modules, pip or env vars never clash with them."""
    import ray

    if ray.is_initialized():
        return False
    plugins = worker_runtime_env(cfg.plugins)
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)
        return False
    apply_embedded_ray_env()
    # Logical CPUs: engines and trainer workers each hold one; they take turns on the cores.
    n = cfg.run.local_num_cpus or max(8, os.cpu_count() or 1)
    # ray.init's documented hidden option for `ray start --metrics-export-port`, the only way to
    # fix the port of a Ray started in-process (tests/test_private_ray.py watches it)
    extra = {"_metrics_export_port": cfg.run.metrics_export_port} if cfg.run.metrics_export_port else {}
    # glibc gives each thread its own malloc arena; PyTorch's varying-size CPU buffers in
    # Ray's many-threaded workers then fragment memory badly. Two arenas keep RSS flat.
    env = {**plugins, "env_vars": {"MALLOC_ARENA_MAX": "2", **plugins.get("env_vars", {})}}
    # Ray Train's placement-group cleaner asks the state API, once a second, whether the
    # learner's controller lives, and the state API finds "the" cluster through RAY_ADDRESS or
    # the last `ray start` on the machine. Beside another cluster it would ask that one, find
    # no such actor and remove this run's live learner. Its workers ask this Ray's own dashboard
    dashboard = free_port()
    env["env_vars"].setdefault("RAY_API_SERVER_ADDRESS", f"http://127.0.0.1:{dashboard}")
    # address "local": a Ray of this run's own even where `ray start` left a cluster on the
    # machine, which a bare ray.init() would join (and then refuse num_cpus)
    ctx = ray.init(address="local", num_cpus=n, include_dashboard=True, dashboard_host="127.0.0.1",
                   dashboard_port=dashboard, runtime_env=env, **extra)
    log(f"local Ray started in-process; dashboard at http://{ctx.dashboard_url}")
    return True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
