"""The critique stage: r0 from the task verifier, c0 from a Ray Serve critic deployment.

The deployment batches requests (`@serve.batch`); the Ray Data stage sends one request per
row, retries failures with backoff, and marks rows whose critique still failed as
`critique_failed` (they keep their verifier reward and are counted, never dropped).
"""
from __future__ import annotations

import asyncio
import json
import math
import time

from ray import serve

from rltf_ray.config import TaskConfig, _build
from rltf_ray.graph import (FIRST_TURN_SCORE, SECOND_TURN_SCORE, CritiqueParams, RewardParams,
                            round_col)
from rltf_ray.rounds import attempt, attempt_text
from rltf_ray.tasks import get_task


def _meta(m) -> dict:
    return json.loads(m) if isinstance(m, str) else dict(m)


# Per-request access logs would print one line per rollout row.
DEPLOYMENT_OPTIONS = dict(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256,
                          logging_config={"log_level": "WARNING", "enable_access_log": False})


MAX_REQUEST_BYTES = 1_000_000  # an HTTP critic request larger than this is refused (413)
ITEM_ERROR = "_critic_item_error"  # a batched critic's marker for one item that failed


class CriticItemError(ValueError):
    """One request the critic could not judge (malformed, or its scoring raised)."""


def per_item(fn, items: list) -> list:
    """`fn(item)` for each item; an item that raises gets an error marker instead, so one
    bad item never fails the other requests of its `@serve.batch`."""
    out = []
    for x in items:
        try:
            out.append(fn(x))
        except Exception as e:  # reported to that item's caller by `judge`
            out.append({ITEM_ERROR: f"{type(e).__name__}: {e}"[:500]})
    return out


def _serve_metrics() -> dict:
    """Prometheus series of a critic replica (Serve adds the app, deployment and replica
    tags): requests, per-item failures and latency, beside Serve's own request metrics."""
    from ray.serve import metrics

    return {"requests": metrics.Counter("rltf_critic_requests", "rltf_ray: critique requests"),
            "errors": metrics.Counter("rltf_critic_item_errors", "rltf_ray: critique requests that failed"),
            "latency": metrics.Histogram("rltf_critic_latency_ms", "rltf_ray: critique latency (ms)",
                                         boundaries=[1, 5, 20, 100, 500, 2000, 10000, 60000])}


class CriticEndpoints:
    """What every critic deployment serves: `judge(item)` (one request; batched critics
    implement `judge_batch`), HTTP with size and shape checks, and call counters."""

    batches = 0
    requests = 0
    _metrics: dict | None = None

    async def judge(self, item: dict) -> dict:
        if self._metrics is None:
            self._metrics = _serve_metrics()
        start = time.perf_counter()
        try:
            res = await self.judge_batch(item)
        except Exception:
            # a whole batch that fails (engine died, timeout) still counts as a request and an error
            self._metrics["errors"].inc()
            raise
        finally:
            self._metrics["requests"].inc()
            self._metrics["latency"].observe(1000 * (time.perf_counter() - start))
        if isinstance(res, dict) and ITEM_ERROR in res:
            self._metrics["errors"].inc()
            raise CriticItemError(res[ITEM_ERROR])
        return res

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        body = await request.body()
        if len(body) > MAX_REQUEST_BYTES:
            return JSONResponse({"error": f"request body is {len(body)} bytes; the limit is "
                                          f"{MAX_REQUEST_BYTES}"}, status_code=413)
        try:
            item = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return JSONResponse({"error": f"request body is not JSON: {e}"}, status_code=400)
        try:
            return await self.judge(item)
        except CriticItemError as e:
            return JSONResponse({"error": str(e)}, status_code=400)

    def stats(self) -> dict:
        return {"batches": self.batches, "requests": self.requests}


@serve.deployment(**DEPLOYMENT_OPTIONS)
class ProgrammaticCritic(CriticEndpoints):
    """Wraps the task's programmatic score and critique.

    Request: {"response": str, "meta": dict | JSON str}.
    Response: {"reward": float, "correct": bool, "format_ok": bool, "critique": str}.
    """

    def __init__(self, task: dict, max_batch_size: int = 64, batch_wait_timeout_s: float = 0.01):
        self.task = get_task(_build(TaskConfig, task, "task"))
        self.judge_batch.set_max_batch_size(max_batch_size)
        self.judge_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

    def judge_one(self, item: dict) -> dict:
        if not isinstance(item, dict) or not isinstance(item.get("response"), str) or "meta" not in item:
            raise ValueError("critic request must be {'response': str, 'meta': object}")
        meta = _meta(item["meta"])
        s = self.task.score(item["response"], meta)
        return {"reward": s.reward, "correct": s.correct, "format_ok": s.format_ok,
                "critique": self.task.critique(item["response"], meta)}

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.01)
    async def judge_batch(self, items: list[dict]) -> list[dict]:
        self.batches += 1
        self.requests += len(items)
        # scoring can be CPU-heavy (math-verify, puzzles): keep the replica's event loop free
        return await asyncio.to_thread(per_item, self.judge_one, items)


@serve.deployment(**DEPLOYMENT_OPTIONS)
class CorrectnessOnlyCritic(ProgrammaticCritic.func_or_class):
    """Ablation: the critique carries only the verdict, no information about the error."""

    def judge_one(self, item: dict) -> dict:
        out = super().judge_one(item)
        out["critique"] = ("Your previous answer was correct." if out["correct"]
                           else "Your previous answer was incorrect.")
        return out


def build_critic_app(task_cfg: TaskConfig, p: CritiqueParams, learned: dict | None = None):
    """The Serve application for `p.critic`, with replicas or autoscaling from the config.
    `learned` (critic 'learned' only): {"engine_names", "model_path", "binac"}."""
    import dataclasses

    from rltf_ray.config import ConfigError, EngineConfig

    opts: dict = {"num_replicas": p.num_replicas}
    if p.max_replicas is not None:
        opts = {"autoscaling_config": {"min_replicas": p.min_replicas, "max_replicas": p.max_replicas,
                                       "target_ongoing_requests": p.target_ongoing_requests}}
    opts["ray_actor_options"] = {**DEPLOYMENT_OPTIONS["ray_actor_options"], "resources": dict(p.resources)}
    if p.critic in ("programmatic", "correctness_only"):
        cls = ProgrammaticCritic if p.critic == "programmatic" else CorrectnessOnlyCritic
        return cls.options(**opts).bind(dataclasses.asdict(task_cfg), p.max_batch_size,
                                         p.batch_wait_timeout_s)
    if p.critic == "llm_judge":
        from rltf_ray.models import resolve_dtype, resolve_model
        from rltf_ray.stages.engine import engine_env
        from rltf_ray.stages.judges import LLMJudgeCritic

        env = engine_env(EngineConfig(), use_gpu=False)
        opts["ray_actor_options"] = {"num_cpus": 1, "runtime_env": {"env_vars": env},
                                     "resources": dict(p.resources)}
        return LLMJudgeCritic.options(**opts).bind(
            resolve_model(p.judge_model), resolve_dtype("auto", False), p.judge_max_tokens,
            2048, p.max_batch_size, max(p.batch_wait_timeout_s, 0.05))
    if p.critic == "learned":
        from rltf_ray.stages.learned_critic import LearnedCritic

        if learned is None:
            raise ConfigError("critic 'learned' runs inside a pipeline, which starts its engines")
        return LearnedCritic.options(**opts).bind(learned["engine_names"], learned["model_path"],
                                                  learned["binac"], p.max_batch_size,
                                                  max(p.batch_wait_timeout_s, 0.05))
    if p.critic == "openai":
        from rltf_ray.stages.judges import OpenAICritic

        return OpenAICritic.options(**opts).bind(p.base_url, p.model, p.api_key_env,
                                                 p.judge_max_tokens, p.timeout_s)
    raise ConfigError(f"critique node: unknown critic '{p.critic}'")


def request_critiques(handle, items: list[dict], p: CritiqueParams) -> tuple[list, list[str]]:
    """Send every item, retrying failures with exponential backoff.

    Returns (results with None for rows that still failed, the last error per failed row)."""
    results: list = [None] * len(items)
    errors = [""] * len(items)
    pending = list(range(len(items)))
    for try_no in range(p.retries + 1):
        responses = {i: handle.judge.remote(items[i]) for i in pending}
        deadline = time.monotonic() + p.timeout_s
        failed = []
        for i, resp in responses.items():
            try:
                results[i] = resp.result(timeout_s=max(0.01, deadline - time.monotonic()))
            except Exception as e:  # timeout, replica crash, bad response: all retried
                resp.cancel()
                errors[i] = f"{type(e).__name__}: {e}"[:300]
                failed.append(i)
        pending = failed
        if not pending:
            break
        if try_no < p.retries:
            time.sleep(p.backoff_s * 2 ** try_no)
    return results, errors


def ask_critic(p: CritiqueParams, rows: list[dict], texts: list[str], which: list[int]):
    """{row index: (result or None, error)} for the rows in `which`."""
    if not which:
        return {}
    items = [{"prompt": rows[i]["prompt"], "response": texts[i], "meta": rows[i]["meta"]} for i in which]
    for item, i in zip(items, which):  # the verifier's verdict, for a verdict-aware learned critic
        if "correct_first" in rows[i]:
            item["verdict"] = bool(rows[i]["correct_first"])
    results, errors = request_critiques(serve.get_app_handle(p.app_name), items, p)
    return {i: (res, err) for i, res, err in zip(which, results, errors)}


def score_texts(task, p: CritiqueParams, rows: list[dict], texts: list[str], which: list[int]) -> dict:
    """{row index: ((reward, correct, format_ok), critic result or None, error)} for `which`:
    the task verifier's score, or -- for a task without one -- the critic's verdict, with a
    NaN reward where the critic failed after its retries."""
    if task.has_verifier:
        out = {}
        for i in which:
            s = task.score(texts[i], _meta(rows[i]["meta"]))
            out[i] = ((s.reward, s.correct, s.format_ok), None, "")
        return out
    return {i: ((math.nan, False, False) if res is None
                else (float(res["reward"]), bool(res["correct"]), bool(res.get("format_ok", True))),
                res, err)
            for i, (res, err) in ask_critic(p, rows, texts, which).items()}


class CriticFailure(RuntimeError):
    pass


def check_critique_failures(rows: list[dict], p: CritiqueParams, rounds: int, step: int) -> None:
    """Stop the run when more than `p.max_failed_fraction` of a step's critique requests failed
    after their retries; the error carries the critic's own message."""
    failed = [r[round_col("critique_error", k)] for k in range(1, rounds + 1) for r in rows
              if r.get(round_col("critique_failed", k))]
    answered = sum(bool(r.get(round_col("revised", k))) for k in range(1, rounds + 1) for r in rows)
    asked = len(failed) + answered
    if failed and len(failed) / asked > p.max_failed_fraction:
        raise CriticFailure(
            f"step {step}: {len(failed)} of {asked} critique requests to '{p.app_name}' failed after "
            f"{p.retries} retries (more than max_failed_fraction={p.max_failed_fraction}); first "
            f"error: {failed[0]}. Without critiques the run would silently be single-turn RL.")


def make_critique(task_cfg: TaskConfig, p: CritiqueParams, turns: int = 2, critique_correct: bool = False):
    """Round k: critique c_{k-1} of the attempt y_{k-1} (and, in round 1, its reward r0).

    Tasks without a verifier take r0 from the critic's verdict, so round 1 asks about every
    row; a row the critic then fails on gets a NaN reward and is left out of training.
    A learned critic (Bi-NAC) also fills its own columns in round 1; with `critique_correct`
    it critiques correct first answers too, for its own training only (no actor revision)."""
    from rltf_ray.stages.learned_critic import empty_critic_columns

    k = p.round
    learned = p.critic == "learned" and k == 1

    def critique(rows: list[dict]) -> list[dict]:
        task = get_task(task_cfg)
        texts = [attempt_text(r, k) for r in rows]
        by_row: dict = {}
        if k == 1:
            scored = score_texts(task, p, rows, texts, list(range(len(rows))))
            rows = [{**r, **dict(zip(FIRST_TURN_SCORE, scored[i][0]))} for i, r in enumerate(rows)]
            if not task.has_verifier:  # the critic already judged every attempt
                by_row = {i: (res, err) for i, (_, res, err) in scored.items()}
        tries = [attempt(r, k) for r in rows]
        want = [] if turns == 1 else [i for i, a in enumerate(tries)
                                      if a.live and not (p.early_termination and a.correct)]
        ask = [i for i, a in enumerate(tries) if a.live] if learned and critique_correct else want
        by_row = by_row or ask_critic(p, rows, texts, ask)
        out = []
        for i, (r, a) in enumerate(zip(rows, tries)):
            res, err = by_row.get(i, (None, ""))
            asked = i in by_row
            out.append({**r, round_col("critique", k): res["critique"] if res else "",
                        round_col("critique_failed", k): asked and res is None,
                        round_col("critique_error", k): err,
                        # The verifier wins over the critic's own verdict; disagreements are counted.
                        round_col("critic_disagrees", k): (task.has_verifier and bool(res)
                                                           and bool(res["correct"]) != a.correct),
                        round_col("revised", k): i in want and res is not None,
                        **({c: res[c] for c in empty_critic_columns()} if learned and res
                           else empty_critic_columns() if k == 1 else {})})
        return out

    return critique


def make_reward(task_cfg: TaskConfig, p: RewardParams, critic: CritiqueParams):
    """Round k: r_k of the revision y_k, from the verifier or (no verifier) the critic's
    verdict. Rows not revised this round carry their last attempt's score forward."""
    k = p.round

    def reward(rows: list[dict]) -> list[dict]:
        task = get_task(task_cfg)
        todo = [i for i, r in enumerate(rows) if r[round_col("revised", k)]]
        texts = [r[round_col("revision", k)] for r in rows]
        scored = score_texts(task, critic, rows, texts, todo)
        out = []
        for i, r in enumerate(rows):
            if i in scored:
                score, failed = scored[i][0], not math.isfinite(scored[i][0][0])
            else:  # the episode ended earlier (correct, or the critic failed)
                a = attempt(r, k)
                score, failed = (a.reward, a.correct, a.format_ok), False
            out.append({**r, **{round_col(c, k): v for c, v in zip(SECOND_TURN_SCORE, score)},
                        round_col("reward_failed", k): failed})
            if k == 1:  # the learned critic's extra revisions (a learned critic needs a verifier)
                extra = r.get("critic_revisions") or []
                out[-1]["critic_revision_rewards"] = [task.score(t, _meta(r["meta"])).reward for t in extra]
        return out

    return reward
