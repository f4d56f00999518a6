"""LLM critics: a vLLM judge inside the Serve replica, and any OpenAI-compatible endpoint.

Both send the judge prompts of `rltf_ray.critics.judge_prompts` (the defaults, or the
critique node's `judge_prompts`), with the answer under judgement quoted as data, and parse
the closing verdict or score line into a reward. The critique stage still lets the task
verifier win where one exists (and counts disagreements)."""
from __future__ import annotations

import asyncio
import os
import re

from rltf_ray.chat import encode
from rltf_ray.critics.base import Critic, register_critic
from rltf_ray.critics.judge_prompts import (  # noqa: F401  (OPEN, CLOSE: re-exported for tests)
    CLOSE, OPEN, judge_messages, resolve_judge_prompts)

VERDICT = re.compile(r"Your previous attempt was (correct|incorrect)\.?", re.IGNORECASE)
SCORE = re.compile(r"Score:\s*(10|[1-9])\s*/\s*10")
VERDICT_LINES = ("Your previous attempt was correct.", "Your previous attempt was incorrect.")
SCORE_LINES = tuple(f"Score: {n}/10" for n in range(1, 11))


def parse_verdict(text: str) -> bool | None:
    found = VERDICT.findall(text)
    return None if not found else found[-1].lower() == "correct"


def parse_score(text: str) -> int | None:
    found = SCORE.findall(text)
    return int(found[-1]) if found else None


def item_fields(item: dict) -> tuple[str, str, dict]:
    """(question, attempt, meta) of a request; the question falls back to meta["question"]."""
    meta = item["meta"]
    return item.get("prompt") or meta.get("question") or "", item["response"], meta


def _result(text: str, meta: dict) -> dict:
    """The critique and its verdict as a reward. A rubric score N gives (N - 1) / 9 and passes
    at meta["pass_score"]; a verdict line gives 1 or 0. An unreadable verdict scores as the
    worst answer and is flagged with format_ok = False."""
    if meta.get("rubric"):
        n = parse_score(text)
        verdict = None if n is None else n >= int(meta.get("pass_score", 8))
        reward = 0.0 if n is None else (n - 1) / 9
    else:
        verdict = parse_verdict(text)
        reward = float(bool(verdict))
    return {"critique": text.strip(), "verdict": verdict, "correct": bool(verdict),
            "reward": reward, "format_ok": verdict is not None}


def verdict_choices(meta: dict) -> tuple[str, ...]:
    return SCORE_LINES if meta.get("rubric") else VERDICT_LINES


def engine_options(params) -> dict:
    """vLLM options of the judge's engine: a CPU KV cache in GiB, or a GPU's share and its
    tensor parallelism (the GPU path is written, not run here)."""
    if params.judge_num_gpus <= 0:
        return {"kv_cache_gib": params.judge_kv_cache_gib}
    tp = int(params.judge_num_gpus) if params.judge_num_gpus >= 1 else 1
    return {"gpu_memory_utilization": params.judge_gpu_memory_utilization, "tensor_parallel_size": tp}


@register_critic("llm_judge")
class LLMJudgeCritic(Critic):
    """A vLLM engine inside the replica, which starts with the engine env vars and a CPU."""

    uses_critic_params = False
    min_batch_wait_s = 0.05  # a bigger batch is a cheaper engine call

    @classmethod
    def prepare(cls, params, context: dict) -> dict:
        from rltf_ray.models import resolve_dtype, resolve_model

        gpu = params.judge_num_gpus > 0
        return {**context, "model_path": resolve_model(params.judge_model, "judge_model"),
                "dtype": resolve_dtype(params.judge_dtype, gpu), "prompts": resolve_judge_prompts(params.judge_prompts)}

    @classmethod
    def replica_options(cls, params) -> dict:
        from rltf_ray.config import EngineConfig
        from rltf_ray.stages.engine import engine_env

        gpu = params.judge_num_gpus > 0
        return {"num_cpus": params.judge_num_cpus, **({"num_gpus": params.judge_num_gpus} if gpu else {}),
                "runtime_env": {"env_vars": engine_env(EngineConfig(), use_gpu=gpu)}}

    @classmethod
    def from_params(cls, task, params, context: dict):
        return cls(task, context["model_path"], context["dtype"], params.judge_max_tokens,
                   params.judge_max_model_len, context["prompts"], engine_options(params),
                   reference_key=params.reference_key)

    def __init__(self, task, model_path: str, dtype: str = "float32", max_tokens: int = 256,
                 max_model_len: int = 2048, prompts: dict | None = None, engine: dict | None = None,
                 reference_key: str | None = None):
        from vllm import LLM

        from rltf_ray.stages.engine import VLLMThread, cpu_kv_cache_bytes

        engine = dict(engine or {"kv_cache_gib": 1.0})
        if "kv_cache_gib" in engine:  # a CPU judge; a GPU one sizes its cache by memory utilization
            engine["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(engine.pop("kv_cache_gib"))
        self.vllm = VLLMThread()
        self.llm = self.vllm.run(LLM, model=model_path, dtype=dtype, enforce_eager=True,
                                 max_model_len=max_model_len, seed=0, **engine)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_tokens = max_tokens
        self.prompts = resolve_judge_prompts(prompts)
        self.reference_key = reference_key

    def _generate(self, prompts: list[list[int]], choices: list[tuple[str, ...]] | None = None) -> list[str]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import StructuredOutputsParams

        if choices is None:
            sps = SamplingParams(temperature=0.0, max_tokens=self.max_tokens)
        else:
            sps = [SamplingParams(temperature=0.0, max_tokens=32,
                                  structured_outputs=StructuredOutputsParams(choice=list(c)))
                   for c in choices]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sps, use_tqdm=False)
        return [o.outputs[0].text for o in outs]

    def _judge_all(self, items: list[dict]) -> list[dict]:
        """Free-text critiques; a critique without a readable verdict line gets one in a second,
        constrained pass (vLLM structured outputs), so even a small judge always decides."""
        fields = [item_fields(x) for x in items]
        convs = [judge_messages(*f, self.prompts, self.reference_key) for f in fields]
        texts = self._generate([encode(self.tokenizer, c) for c in convs])
        missing = [i for i, (t, f) in enumerate(zip(texts, fields)) if not _result(t, f[2])["format_ok"]]
        if missing:
            follow = [convs[i] + [{"role": "assistant", "content": texts[i]},
                                  {"role": "user", "content": self.prompts["final_line"]}]
                      for i in missing]
            lines = self._generate([encode(self.tokenizer, c) for c in follow],
                                   [verdict_choices(fields[i][2]) for i in missing])
            for i, line in zip(missing, lines):
                texts[i] = f"{texts[i].rstrip()}\n{line}"
        return [_result(t, f[2]) for t, f in zip(texts, fields)]

    async def judge(self, items: list[dict]) -> list[dict]:
        # off the replica's event loop, on the thread that built the engine
        return await asyncio.wrap_future(self.vllm.submit(self._judge_all, items))


@register_critic("openai")
class OpenAICritic(Critic):
    """Any OpenAI-compatible chat endpoint, one call per item, concurrently; the key is read
    from the env var named in the config and never logged or returned."""

    uses_critic_params = False

    @classmethod
    def prepare(cls, params, context: dict) -> dict:
        return {**context, "prompts": resolve_judge_prompts(params.judge_prompts)}

    @classmethod
    def from_params(cls, task, params, context: dict):
        return cls(task, params.base_url, params.model, params.api_key_env, params.judge_max_tokens,
                   params.timeout_s, prompts=context["prompts"], reference_key=params.reference_key)

    def __init__(self, task, base_url: str, model: str, api_key_env: str | None = None,
                 max_tokens: int = 256, request_timeout_s: float = 60.0, prompts: dict | None = None,
                 reference_key: str | None = None):
        import httpx

        headers = {}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ValueError(f"critic: env var {api_key_env} (api_key_env) is not set")
            headers["Authorization"] = f"Bearer {key}"
        self.client = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers,
                                        timeout=request_timeout_s)
        self.model, self.max_tokens = model, max_tokens
        self.prompts = resolve_judge_prompts(prompts)
        self.reference_key = reference_key

    async def _one(self, item: dict) -> dict:
        question, attempt, meta = item_fields(item)
        body = {"model": self.model, "messages": judge_messages(question, attempt, meta, self.prompts,
                                                                 self.reference_key),
                "max_tokens": self.max_tokens, "temperature": 0.0}
        r = await self.client.post("/chat/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"judge endpoint answered HTTP {r.status_code}: {r.text[:200]}")
        return _result(r.json()["choices"][0]["message"]["content"] or "", meta)

    async def judge(self, items: list[dict]) -> list:
        # an item whose call fails (HTTP error, timeout) fails alone: its exception is its result
        return await asyncio.gather(*(self._one(x) for x in items), return_exceptions=True)
