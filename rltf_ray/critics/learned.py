"""Bi-NAC's learned critic: a critic in front of the critic model's own vLLM engines.

The engines are `PolicyEngine` actors like the actor's, started by the runner and addressed
by name, so that the trainer's `WeightSync` pushes the critic's new weights into them
exactly as it does for the actor (a Serve replica cannot be addressed one by one for a
broadcast). Each request asks for K critiques c ~ pi_C(. | x0, y0) of one attempt (an item's
"samples" asks for another number: the held-out evaluation asks for the one it uses; its
"temperature" for another temperature than binac.temperature); every
critique must end with a verdict line, which is checked against the verifier.
"""
from __future__ import annotations

import asyncio

from rltf_ray.chat import encode, load_tokenizer
from rltf_ray.critics.base import Critic, per_item, register_critic
from rltf_ray.critics.judge_prompts import CLOSE, INJECTION_NOTE, OPEN
from rltf_ray.critics.judges import item_fields, parse_verdict
from rltf_ray.errors import ConfigError

CONTEXT_KEYS = ("engine_names", "model_path", "binac", "max_model_len")
OVERFLOW = "critic_context_overflow"  # a result's key: the prompt did not fit, nothing was asked


def critic_messages(system: str, question: str, attempt: str, verdict: bool | None) -> list[dict]:
    """The critic's conversation; `verdict` (the verifier's) is shown when not None."""
    attempt = attempt.replace(CLOSE, "ATTEMPT >>")  # the attempt cannot close the quote early
    user = f"Question:\n{question}\n\n{INJECTION_NOTE}\n{OPEN}\n{attempt}\n{CLOSE}"
    if verdict is not None:
        user += f"\n\nA verifier checked this attempt: it is {'correct' if verdict else 'incorrect'}."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def empty_critic_columns() -> dict:
    """The learned critic's columns for a row it did not critique (or another critic)."""
    return {"critic_version": -1, "critic_prompt_ids": [], "critic_critiques": [],
            "critic_critique_ids": [], "critic_critique_logprobs": [], "critic_verdicts": [],
            "critic_format_ok": []}


@register_critic("learned")
class LearnedCritic(Critic):
    """Item: {"prompt", "response", "meta", "verdict": bool (the verifier's verdict, shown
    to a verdict-aware critic), "samples": int (critiques wanted; unset, K), "temperature":
    float (0 = greedy; unset, binac.temperature)}. Result: the
    first critique as "critique" (what the actor revises from), all of them with their token ids,
    log-probs, verdicts and format flags, the critic's prompt ids and the version of the
    weights that wrote them."""

    uses_critic_params = False
    min_batch_wait_s = 0.05  # a bigger batch is a cheaper engine call

    @classmethod
    def prepare(cls, params, context: dict) -> dict:
        if any(k not in context for k in CONTEXT_KEYS):
            raise ConfigError("critic 'learned' runs inside a pipeline, which starts its engines")
        return context

    @classmethod
    def from_params(cls, task, params, context: dict):
        return cls(task, *(context[k] for k in CONTEXT_KEYS))

    def __init__(self, task, engine_names: list[str], model_path: str, binac: dict, max_model_len: int):
        import ray

        from rltf_ray.config import BinacConfig, _build

        self.engines = [ray.get_actor(n) for n in engine_names]
        self.model_path = model_path
        self.b = _build(BinacConfig, binac, "binac")
        self.max_model_len = max_model_len

    def _prompt(self, item: dict) -> list[int]:
        question, attempt, _ = item_fields(item)
        verdict = bool(item["verdict"]) if self.b.verdict_aware and "verdict" in item else None
        return encode(load_tokenizer(self.model_path), critic_messages(self.b.prompt, question, attempt, verdict))

    def _samples(self, item: dict) -> int:
        n = item.get("samples", self.b.critiques_per_attempt)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"an item's 'samples' must be a positive int, got {n!r}")
        return n

    def _temperature(self, item: dict) -> float:
        t = item.get("temperature", self.b.temperature)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
            raise ValueError(f"an item's 'temperature' must be a number >= 0 (0 = greedy), got {t!r}")
        return float(t)

    def _encode(self, item: dict) -> list[int]:
        self._samples(item)  # checked here so that a bad item fails alone
        self._temperature(item)
        return self._prompt(item)

    async def judge(self, items: list[dict]) -> list:
        out: list = per_item(self._encode, items)  # an item that cannot be encoded fails alone
        for i, x in enumerate(out):
            # a prompt the critic's engine cannot take with max_tokens is never sent: the
            # episode ends there, counted (as the actor's context_overflow), not failed
            if not isinstance(x, Exception) and len(x) + self.b.max_tokens > self.max_model_len:
                out[i] = {"critique": "", "correct": False, "reward": 0.0, OVERFLOW: len(x)}
        good = [i for i, x in enumerate(out) if isinstance(x, list)]
        prompts = {i: out[i] for i in good}
        calls, asked = [], {i: (self._samples(items[i]), self._temperature(items[i])) for i in good}
        # one engine call per number of critiques and temperature asked (K at binac.temperature
        # in training; 1 in an evaluation, at eval.critic_temperature where that is set)
        for n, temperature in sorted(set(asked.values())):
            want = [i for i in good if asked[i] == (n, temperature)]
            shards = [want[i::len(self.engines)] for i in range(len(self.engines))]
            calls += [(idx, e.generate.remote([prompts[i] for i in idx], n=n, temperature=temperature,
                                              top_p=1.0, max_tokens=self.b.max_tokens))
                      for e, idx in zip(self.engines, shards) if idx]
        results = await asyncio.gather(*(ref for _, ref in calls))
        for (idx, _), res in zip(calls, results):
            for i, group in zip(idx, res["outputs"]):
                texts = [g.text.strip() for g in group]
                verdicts = [parse_verdict(t) for t in texts]
                out[i] = {"critique": texts[0], "critic_version": res["version"],
                          "critic_prompt_ids": prompts[i], "critic_critiques": texts,
                          "critic_critique_ids": [list(g.token_ids) for g in group],
                          "critic_critique_logprobs": [list(g.logprobs) for g in group],
                          "critic_verdicts": verdicts, "critic_format_ok": [v is not None for v in verdicts],
                          "correct": bool(verdicts[0]), "reward": float(bool(verdicts[0]))}
        return out
