"""Where an engine's generation time goes: the same vLLM generation of the same prompts,
hosted several ways (each mode in a process of its own, one after another).

    .venv/bin/python benchmarks/bench_engine_host.py [--model smollm2] [--steps 3] [--modes main,logprobs,flat,nodetok,thread,own,actor,actor_arena2]

main      `LLM.generate` in the process's main thread (bench_compare's raw-vLLM floor);
logprobs  as main, plus the sampled tokens' log-probs under processed_logprobs (what the
          importance ratio needs, and what rltf_ray's engines ask for);
flat      as logprobs, with `flat_logprobs=True` (one flat container, fewer Python objects);
nodetok   as flat, with `detokenize=False` (no text, no decoded log-prob tokens);
thread    as logprobs, built in the main thread, called from a worker thread (a threaded
          Ray actor runs its methods on pool threads so);
own       as logprobs, built and called from one worker thread (what `VLLMThread` does);
actor     rltf_ray's PolicyEngine as a Ray actor, as the pipeline starts it (no pipeline);
actor_arena2  as actor, in a Ray whose job environment sets MALLOC_ARENA_MAX=2 (as
          `pipelines/run.py`'s embedded Ray does, for the learner's memory).
Prints seconds per step for the same prompts and seeds (bench_compare's first 8 x 4 x 128).

--background runs each mode again beside a synthetic load of that many cores' worth of CPU,
spread over 8 processes that each wake every 20 ms (Ray's daemons and idle actors look like
that: many small wake-ups, 35-40% of a core in all; docs/benchmarks.md), to tell
how much such a load costs an engine whose OpenMP threads wait for each other."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_compare import step_prompts  # noqa: E402
from common import choose  # noqa: E402

MODES = ("main", "logprobs", "flat", "nodetok", "thread", "own", "actor", "actor_arena2")


def one(mode: str, model: str, steps: int) -> list[float]:
    from rltf_ray.chat import load_tokenizer
    from rltf_ray.config import EngineConfig
    from rltf_ray.models import resolve_dtype, resolve_model
    from rltf_ray.stages.engine import PolicyEngine, engine_env

    path, dtype = resolve_model(model), resolve_dtype("auto", False)  # what the pipeline's engines use here
    cfg = EngineConfig(num_engines=1, max_model_len=1024, kv_cache_gib=2)
    batches = [[p for p, _, _ in b] for b in step_prompts(load_tokenizer(path), steps, 8)]
    if mode.startswith("actor"):
        import ray

        job_env = {"env_vars": {"MALLOC_ARENA_MAX": "2"}} if mode == "actor_arena2" else None
        ray.init(num_cpus=4, include_dashboard=False, runtime_env=job_env)
        engine = ray.remote(PolicyEngine).options(max_concurrency=4, num_cpus=1,
                                                  runtime_env={"env_vars": engine_env(cfg, False)})
        e = engine.remote(path, cfg, dtype, 0)
        ray.get(e.ready.remote())
        return [ray.get(e.generate.remote(b, 4, 1.0, 1.0, 128))["seconds"] for b in batches]
    os.environ.update(engine_env(cfg, False))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = dict(model=path, dtype=dtype, enforce_eager=True, max_model_len=1024, seed=0)
    if mode != "main":
        kw["logprobs_mode"] = "processed_logprobs"
    pool = ThreadPoolExecutor(1)  # one worker thread, kept for the whole run
    llm = pool.submit(LLM, **kw).result() if mode == "own" else LLM(**kw)
    extra = {"flat": dict(flat_logprobs=True), "nodetok": dict(flat_logprobs=True, detokenize=False)}.get(mode, {})
    sp = SamplingParams(n=4, temperature=1.0, max_tokens=128, logprobs=None if mode == "main" else 0, **extra)
    out = []
    for b in batches:
        prompts = [TokensPrompt(prompt_token_ids=p) for p in b]
        t = time.perf_counter()
        if mode in ("thread", "own"):
            pool.submit(llm.generate, prompts, sp, use_tqdm=False).result()
        else:
            llm.generate(prompts, sp, use_tqdm=False)
        out.append(time.perf_counter() - t)
    return out


def _spin(share: float, nice: int, period: float = 0.02) -> None:
    os.nice(nice)
    busy = share * period
    while True:
        t = time.perf_counter()
        while time.perf_counter() - t < busy:
            pass
        time.sleep(period - busy)


def background(total: float, nice: int = 0, procs: int = 8) -> list:
    import multiprocessing as mp

    out = [mp.Process(target=_spin, args=(total / procs, nice), daemon=True) for _ in range(procs if total > 0 else 0)]
    for p in out:
        p.start()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--background", default="0", help="comma-separated synthetic loads, in cores")
    ap.add_argument("--background-nice", type=int, default=0,
                    help="the synthetic load's niceness (Ray's daemons run at 0, its workers at 15)")
    ap.add_argument("--only", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.only:
        print("SECONDS", " ".join(f"{x:.2f}" for x in one(a.only, a.model, a.steps)))
        return 0
    modes = choose(ap, "--modes", a.modes, MODES)
    from rltf_ray.models import resolve_dtype

    print(f"\n{a.model}: 8 prompts x 4 samples x 128 new tokens, {os.cpu_count()} cores, "
          f"{resolve_dtype('auto', False)}, "
          f"background at niceness {a.background_nice}")
    print("| host | background load, cores | seconds per step | mean |\n| --- | --- | --- | --- |")
    for load in [float(x) for x in a.background.split(",")]:
        for mode in modes:
            spinners = background(load, a.background_nice)
            try:
                got = subprocess.run([sys.executable, __file__, "--model", a.model, "--steps", str(a.steps),
                                      "--only", mode], capture_output=True, text=True)
            finally:
                for p in spinners:
                    p.kill()
            line = [x for x in got.stdout.splitlines() if x.startswith("SECONDS")]
            if got.returncode or not line:
                print(f"| {mode} | {load} | failed (exit {got.returncode}): {got.stderr.strip().splitlines()[-1:]} | - |")
                continue
            xs = [float(x) for x in line[0].split()[1:]]
            print(f"| {mode} | {load} | {', '.join(f'{x:.1f}' for x in xs)} | {sum(xs) / len(xs):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
