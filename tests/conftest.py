import os
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from rltf_ray.models import cache_dir  # noqa: E402
from rltf_ray.ray_start import apply_embedded_ray_env, free_port  # noqa: E402

apply_embedded_ray_env()  # the tests' own Ray gets what ray_start.init_ray sets


@pytest.fixture(scope="session")
def tiny_path() -> str:
    path = cache_dir() / "tiny"
    if not (path / "config.json").is_file():
        pytest.fail("the tiny model is not built; run `make models-tiny` (make test does it)")
    return str(path)


@pytest.fixture(scope="session")
def tiny_wide_path(tiny_path, tmp_path_factory) -> str:
    """The tiny model with one more token, its pad (id 512): a model whose vocabulary and pad
    id differ from the tiny model's, whose largest id is 511."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("tiny_wide")
    tok = AutoTokenizer.from_pretrained(tiny_path)
    tok.add_special_tokens({"pad_token": "<|pad_wide|>"})
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    model.resize_token_embeddings(len(tok))
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    assert tok.pad_token_id == 512
    return str(out)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    from rltf_ray.chat import load_tokenizer

    return load_tokenizer(tiny_path)


@pytest.fixture(scope="session")
def gloo_world():
    """One single-rank gloo world shared by every in-process DeepSpeed test. DeepSpeed keeps
    the first process group it sees, so a second init after a destroy leaves it holding a
    dead group ("Group ... is not registered")."""

    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0")
        dist.init_process_group("gloo", rank=0, world_size=1)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    yield


@pytest.fixture(scope="module")
def shared_ray():
    """One local Ray for a test module's runs (each Pipeline joins it)."""
    import ray
    from ray import serve

    ray.init(num_cpus=8, include_dashboard=False)
    yield
    serve.shutdown()
    ray.shutdown()


@pytest.fixture
def needs_realtime():
    """Skip where this process may not take SCHED_RR (no CAP_SYS_NICE, `ulimit -r` 0)."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except PermissionError:
        pytest.skip("this machine gives the tests no CAP_SYS_NICE / RLIMIT_RTPRIO")
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def engine_logprobs(engine, prompt: list[int], target: list[int]) -> list[float]:
    """What an engine actor's weights give the target tokens (tests of the weight sync):
    log pi(target_t | prompt, target_<t), from vLLM's prompt log-probs."""
    import ray

    def sequence_logprobs(actor, prompt: list[int], target: list[int]) -> list[float]:
        # defined here so that it travels by value: the actor cannot import this test module
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        out = actor.vllm.run(actor.llm.generate, [TokensPrompt(prompt_token_ids=prompt + target)], sp,
                             use_tqdm=False)[0]
        return [d[t].logprob for d, t in zip(out.prompt_logprobs[len(prompt):], target)]

    return ray.get(engine.__ray_call__.remote(sequence_logprobs, prompt, target))


def critic_plugin(name: str, critique: str, imports: str = "") -> str:
    """The text of a plugin file whose critic, registered as `name`, scores the requests with
    the task (one batch: reward functions get their ids and step) and critiques each with the
    Python expression `critique` (over `it`, the request)."""
    return (f"{imports}\nimport rltf_ray\nfrom rltf_ray.critics import score_items\n\n\n"
            f"@rltf_ray.register_critic({name!r})\nclass PluginCritic:\n"
            "    def __init__(self, task):\n        self.task = task\n\n    def judge(self, items):\n"
            "        out = []\n        for it, s in zip(items, score_items(self.task, items)):\n"
            f"            out.append({{'reward': s.reward, 'correct': s.correct, 'critique': {critique}}})\n"
            "        return out\n")


@pytest.fixture(scope="session")
def tiny_tied_path(tiny_path, tmp_path_factory) -> str:
    """The tiny model with its LM head tied to its input embedding, as SmolLM2's is."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path_factory.mktemp("tiny_tied")
    config = AutoConfig.from_pretrained(tiny_path)
    config.tie_word_embeddings = True
    src = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict({k: v for k, v in src.state_dict().items() if k != "lm_head.weight"}, strict=False)
    model.tie_weights()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(tiny_path) / f).exists():
            shutil.copy(Path(tiny_path) / f, out / f)
    return str(out)


def undocumented_keys(record: dict, section: str) -> list[str]:
    """The keys of a run's `record` (a metrics.jsonl line, summary.json, a runs.jsonl record)
    that docs/metrics.md has no line for under its heading that starts with `section`
    or under any of several that start with it (`<k>` in a documented key matches a number)."""
    import re

    text = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    parts = re.split(r"^## ", text, flags=re.M)
    bodies = [p for p in parts if p.startswith(section)]
    assert bodies, f"docs/metrics.md has no section '{section}'"
    keys = [k for b in bodies for k in re.findall(r"^\| `([^`]+)` \|", b, flags=re.M)]
    pats = [re.compile(re.escape(k).replace(re.escape("<k>"), r"\d+") + "$") for k in keys]
    return sorted(k for k in record if not any(p.match(k) for p in pats))


def head_node(gcs_port: int, dashboard_port: int, **extra_env) -> dict:
    """Start a Ray head node of this test's own (`ray start --head`); the environment whose
    RAY_ADDRESS-free PATH reaches it. Stop it with `stop_head(gcs_port)`."""
    import subprocess
    import sys

    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", RAY_AUTH_MODE="disabled", **extra_env)
    env.pop("RAY_ADDRESS", None)
    # Ray's per-node agents listen on fixed default ports (52365 for the dashboard agent, which
    # runs jobs): another Ray on the machine (a training run) would hold them, and this head
    # would then have no job agent. Free ports of its own avoid that.
    agents = [f"--{flag}={free_port()}" for flag in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                      "metrics-export-port", "runtime-env-agent-port")]
    subprocess.run([str(bin_dir / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs_port}",
                    "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}", "--num-cpus=8",
                    "--disable-usage-stats", *agents], check=True, env=env, capture_output=True, timeout=180)
    return env


def stop_head(gcs_port: int) -> None:
    """Stop the head node a test started, and only it: `ray stop --force` would kill every
    Ray process of the machine, a training run's beside the test included. Its processes are
    the ones whose command line names its GCS port."""
    import re
    import signal
    import time

    mark = re.compile(rf"[:=]{gcs_port}\b")  # --gcs-address=<node ip>:PORT, --gcs_server_port=PORT, --port=PORT
    current = Path("/tmp/ray/ray_current_cluster")  # what a later ray.init() would connect to
    if current.is_file() and mark.search(":" + current.read_text().strip().rpartition(":")[2]):
        current.unlink()
    for _ in range(30):
        found = []
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if pid != os.getpid() and mark.search(cmd):
                found.append(pid)
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(1)


def record_delete(app: str) -> None:
    """A test reaper's `delete`: records the app in the `deletion_log` actor instead of
    calling Serve (the reaper's worker imports this module: tests/ on its PYTHONPATH)."""
    import ray

    ray.get(ray.get_actor("deleted", namespace="rltf_ray").add.remote(app))


def deletion_log(**options):
    """The named actor that `record_delete` writes to; `.get.remote()` lists the apps."""
    import ray

    @ray.remote(num_cpus=0)
    class Deleted:
        def __init__(self):
            self.apps = []

        def add(self, app):
            self.apps.append(app)

        def get(self):
            return self.apps

    return Deleted.options(name="deleted", namespace="rltf_ray", **options).remote()
