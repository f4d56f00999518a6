"""Held-out evaluation of a policy served by the engines: what RLTF is for is the first
answer with no feedback, so that is measured first; feedback rounds show what critiques
(the task's critic, or the model's own FM critique) add on top.

Measures (each over distinct held-out problems, with its standard error):
  greedy           single-turn accuracy, temperature 0
  pass@k           sampled at the first turn's temperature, unbiased estimator over `samples`
  feedback         the critic in the loop: accuracy after each of K critique rounds
                   (a correct answer ends its episode, as in training)
  self_feedback    the model critiques its own latest answer with the FM prompt, then
                   revises; no oracle, every answer is revised each round
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import ray

from rltf_ray.chat import encode, first_turn_messages, fm_messages, load_tokenizer, revision_messages

Score = tuple[float, bool, bool]  # (reward, correct, format_ok)


def generate(engines: list, prompts: list[list[int]], n: int, temperature: float,
             max_tokens: int) -> list[list]:
    """`n` samples per token-id prompt, the prompts spread over the engines; in order."""
    shards = [list(range(i, len(prompts), len(engines))) for i in range(len(engines))]
    futs = [(idx, e.generate.remote([prompts[i] for i in idx], n=n, temperature=temperature,
                                    top_p=1.0, max_tokens=max_tokens))
            for e, idx in zip(engines, shards) if idx]
    out: list = [None] * len(prompts)
    for idx, fut in futs:
        for i, group in zip(idx, ray.get(fut)["outputs"]):
            out[i] = group
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (sample std / sqrt(n))."""
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    m = sum(values) / n
    if n == 1:
        return m, 0.0
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


@dataclass
class Evaluator:
    """Runs the measures against live engines. Answers are the engine's outputs (`.text`,
    `.token_ids`). `score(rows, answers, version)` gives a Score per answer (the verifier, or
    the critic for a task without one); `critique(rows, answers, which, version)` gives
    {index: (critique text, or None where it failed, error)} from the task's critic. `version`
    is the policy version evaluated: reward functions get it as trainer_state.global_step."""

    engines: list
    model_path: str
    task: object
    score: Callable[[list[dict], list, int], list[Score]]
    critique: Callable[[list[dict], list, list[int], int], dict]
    temperature: float
    max_tokens: int
    revision_template: str
    critique_max_tokens: int = 128
    max_failed_fraction: float = 0.2
    version: int = field(default=0, init=False)  # set by `run` from the engines

    def _x0(self, rows: list[dict]) -> list[list[int]]:
        tok = load_tokenizer(self.model_path)
        return [encode(tok, first_turn_messages(r)) for r in rows]

    def _greedy(self, prompts: list[list[int]], max_tokens: int | None = None) -> list:
        """One greedy answer per prompt, as the engine returned it (text and token ids)."""
        return [g[0] for g in generate(self.engines, prompts, 1, 0.0, max_tokens or self.max_tokens)]

    def run(self, rows: list[dict], pass_k: list[int], samples: int, feedback_rounds: int,
            self_feedback_rounds: int, greedy: bool = True) -> dict:
        self.version = ray.get(self.engines[0].ready.remote())
        out: dict = {"problems": len(rows), "version": self.version}
        x0 = self._x0(rows)
        first: list = []
        if greedy or feedback_rounds or self_feedback_rounds:
            first = self._greedy(x0)
            s = self.score(rows, first, self.version)
            out["greedy_accuracy"], out["greedy_accuracy_se"] = mean_se([float(c) for _, c, _ in s])
            out["greedy_reward"] = mean_se([r for r, _, _ in s if math.isfinite(r)])[0]
            out["greedy_format_rate"] = mean_se([float(f) for _, _, f in s])[0]
            out["greedy_unscored"] = sum(not math.isfinite(r) for r, _, _ in s)  # judge failures
            out["sample_texts"] = [a.text for a in first[:3]]
            out["greedy_correct"] = [int(c) for _, c, _ in s]  # per problem: a paired gain's SE
        if pass_k:
            out.update(self._pass_at_k(rows, x0, pass_k, samples))
        if feedback_rounds:
            out.update(self._feedback(rows, first, feedback_rounds))
        if self_feedback_rounds:
            out.update(self._self_feedback(rows, first, self_feedback_rounds))
        return out

    def _pass_at_k(self, rows, x0, ks: list[int], samples: int) -> dict:
        groups = generate(self.engines, x0, samples, self.temperature, self.max_tokens)
        answers = [g for group in groups for g in group]
        flat_rows = [r for r in rows for _ in range(samples)]
        correct = [c for _, c, _ in self.score(flat_rows, answers, self.version)]
        per_problem = [sum(correct[i * samples:(i + 1) * samples]) for i in range(len(rows))]
        out = {"pass_samples": samples, "pass_temperature": self.temperature}
        for k in ks:
            m, se = mean_se([pass_at_k(samples, c, k) for c in per_problem])
            out[f"pass@{k}"], out[f"pass@{k}_se"] = m, se
        return out

    def _revise(self, rows: list[dict], exchanges: list[list[tuple[str, str]]], which: list[int]) -> dict:
        """{index: the greedy revision (an engine output)} of the rows in `which`."""
        tok = load_tokenizer(self.model_path)
        prompts = [encode(tok, revision_messages(rows[i], exchanges[i], self.revision_template))
                   for i in which]
        return dict(zip(which, self._greedy(prompts))) if which else {}

    def _feedback(self, rows, first: list, rounds: int) -> dict:
        """The critic in the loop; an answer that is right ends its episode.

        The accuracy is over the same problems as the first try's. A problem whose critique
        failed (after the critic's retries) counts as not fixed and is not critiqued again:
        leaving it out would drop a wrong answer from the denominator (only wrong answers are
        critiqued) and lift the accuracy. The failures are counted beside it, with the first
        error. When more than `max_failed_fraction` of the requests failed, the measure is not
        reported at all (the training loop stops a step at the same bound)."""
        latest, exchanges = list(first), [[] for _ in rows]
        correct = [c for _, c, _ in self.score(rows, latest, self.version)]
        measured = [True] * len(rows)
        asked = failed = 0
        error = ""
        out: dict = {}
        for k in range(1, rounds + 1):
            todo = [i for i, c in enumerate(correct) if not c and measured[i]]
            crit = self.critique(rows, latest, todo, self.version)
            live = [i for i in todo if crit[i][0] is not None]
            asked += len(todo)
            for i in todo:
                if crit[i][0] is None:
                    failed += 1
                    measured[i] = False
                    error = error or crit[i][1]
            for i in live:
                exchanges[i].append((latest[i].text, crit[i][0]))
            revised = self._revise(rows, exchanges, live)
            for i, answer in revised.items():
                latest[i] = answer
            if live:
                got = self.score([rows[i] for i in live], [latest[i] for i in live], self.version)
                for i, (_, c, _) in zip(live, got):
                    correct[i] = c
            out[f"feedback_accuracy_{k}"], out[f"feedback_accuracy_{k}_se"] = mean_se([float(c) for c in correct])
            out[f"feedback_problems_{k}"] = len(correct)
        out["feedback_critique_failed"] = failed
        if failed:
            out["feedback_critique_error"] = error
        if asked and failed / asked > self.max_failed_fraction:
            for k in range(1, rounds + 1):
                del out[f"feedback_accuracy_{k}"], out[f"feedback_accuracy_{k}_se"]
            out["feedback_unmeasured"] = (
                f"{failed} of {asked} critique requests failed (more than max_failed_fraction="
                f"{self.max_failed_fraction}); first error: {error}")
        return out

    def _self_feedback(self, rows, first: list, rounds: int) -> dict:
        """The model's own critique (the FM prompt), then a revision; no oracle stops it."""
        tok = load_tokenizer(self.model_path)
        latest, exchanges = list(first), [[] for _ in rows]
        out: dict = {}
        for k in range(1, rounds + 1):
            prompts = [encode(tok, fm_messages(r["prompt"], latest[i].text)) for i, r in enumerate(rows)]
            critiques = self._greedy(prompts, self.critique_max_tokens)
            for i, c in enumerate(critiques):
                exchanges[i].append((latest[i].text, c.text.strip()))
            for i, answer in self._revise(rows, exchanges, list(range(len(rows)))).items():
                latest[i] = answer
            s = self.score(rows, latest, self.version)
            out[f"self_feedback_accuracy_{k}"], out[f"self_feedback_accuracy_{k}_se"] = \
                mean_se([float(c) for _, c, _ in s])
        return out
