"""The critique stage: r0 from the task verifier, c0 from a Ray Serve critic deployment.

The deployment (`rltf_ray.critics.deployment`, any registered critic) batches requests; the
Ray Data stage sends one request per row, retries failures with backoff, and marks rows
whose critique still failed as `critique_failed` (they keep their verifier reward and are
counted, never dropped).
"""
from __future__ import annotations

import json
import math
import time

from ray import serve

from rltf_ray.config import TaskConfig
from rltf_ray.errors import StageFailure
from rltf_ray.critics.base import CriticItemError  # noqa: F401  (re-exported)
from rltf_ray.critics.deployment import (  # noqa: F401  (re-exported: runner, serve/critic_app.py)
    MAX_REQUEST_BYTES, build_critic_app)
from rltf_ray.critics.learned import OVERFLOW, empty_critic_columns
from rltf_ray.graph import (FIRST_TURN_SCORE, SECOND_TURN_SCORE, CritiqueParams, RewardParams,
                            round_col)
from rltf_ray.rounds import attempt, attempt_ids, attempt_text
from rltf_ray.tasks import get_task


def _meta(m) -> dict:
    return json.loads(m) if isinstance(m, str) else dict(m)


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
                # the critic's own error, not Ray's wrapper, whose replica traceback comes first
                cause = getattr(e, "cause", None)
                e = cause if isinstance(cause, Exception) else e
                errors[i] = f"{type(e).__name__}: {e}"[:300]
                failed.append(i)
        pending = failed
        if not pending:
            break
        if try_no < p.retries:
            time.sleep(p.backoff_s * 2 ** try_no)
    return results, errors


def ask_critic(p: CritiqueParams, rows: list[dict], texts: list[str], which: list[int],
               samples: int | None = None, ids: list | None = None, step: int | None = None,
               temperature: float | None = None):
    """{row index: (result or None, error)} for the rows in `which`. `samples`: how many
    critiques a sampling critic (the learned one) writes per row; unset, its configured K.
    `temperature`: the sampling critic's temperature for these rows; unset, its configured one.
    `ids` (the answers' token ids) and `step` go with the requests where known: the task's
    reward functions get them as completion_ids and trainer_state.global_step."""
    if not which:
        return {}
    items = [{"prompt": rows[i]["prompt"], "response": texts[i], "meta": rows[i]["meta"]} for i in which]
    for item, i in zip(items, which):
        if ids is not None:
            item["response_ids"] = list(ids[i])
        if step is not None:
            item["global_step"] = step
    if samples is not None:
        for item in items:
            item["samples"] = samples
    if temperature is not None:
        for item in items:
            item["temperature"] = temperature
    for item, i in zip(items, which):  # the verifier's verdict, for a verdict-aware learned critic
        if "correct_first" in rows[i]:
            item["verdict"] = bool(rows[i]["correct_first"])
    results, errors = request_critiques(serve.get_app_handle(p.app_name), items, p)
    return {i: (res, err) for i, res, err in zip(which, results, errors)}


def known(ids: list) -> list | None:
    """`ids` when every answer has its token ids, else None: the batch is scored without them."""
    return None if any(x is None for x in ids) else ids


def score_texts(task, p: CritiqueParams, rows: list[dict], texts: list[str], which: list[int],
                ids: list | None = None, step: int | None = None) -> dict:
    """{row index: ((reward, correct, format_ok), critic result or None, error)} for `which`:
    the task verifier's score (one `score_batch` for them all), or -- for a task without one --
    the critic's verdict, with a NaN reward where the critic failed after its retries. `ids`:
    every text's token ids; `step`: the RL step (the policy version in an evaluation)."""
    if task.has_verifier:
        got = task.score_batch([texts[i] for i in which], [_meta(rows[i]["meta"]) for i in which],
                               None if ids is None else [ids[i] for i in which], step)
        return {i: ((s.reward, s.correct, s.format_ok), None, "") for i, s in zip(which, got)}
    return {i: ((math.nan, False, False) if res is None
                else (float(res["reward"]), bool(res["correct"]), bool(res.get("format_ok", True))),
                res, err)
            for i, (res, err) in ask_critic(p, rows, texts, which, ids=ids, step=step).items()}


def batch_step(rows: list[dict]) -> int | None:
    """The RL step of a batch's rows (one step's rollout); None for rows built without one."""
    steps = {r.get("step") for r in rows}
    if len(steps) > 1:
        raise ValueError(f"a batch of rows from several steps {sorted(steps)}; a stage sees one step's rows")
    return steps.pop() if steps else None


class CriticFailure(StageFailure):
    """More of a step's critique requests failed than critique.max_failed_fraction allows."""


def check_critique_failures(rows: list[dict], p: CritiqueParams, rounds: int, step: int) -> None:
    """Stop the run when more than `p.max_failed_fraction` of a step's requests to the critic
    failed after their retries; the error carries the critic's own message. Every request
    counts, whatever its row became: critiques (of correct answers too, for a learned critic;
    of attempts whose revision then overflowed the context) and the verdicts that score a task
    without a verifier (first answers, in single-turn runs too, and revisions)."""
    def flags(name: str) -> list[bool]:
        return [bool(r.get(round_col(name, k))) for k in range(1, rounds + 1) for r in rows]

    errors = [r[round_col("critique_error", k)] for k in range(1, rounds + 1) for r in rows
              if r.get(round_col("critique_failed", k))]
    asked = sum(flags("critique_asked")) + sum(flags("reward_asked"))
    failed = len(errors) + sum(flags("reward_failed"))
    if failed and failed / asked > p.max_failed_fraction:
        first = errors[0] if errors else "a verdict on a revision (the critic's score) failed"
        raise CriticFailure(
            f"step {step}: {failed} of {asked} requests to the critic '{p.app_name}' failed after "
            f"{p.retries} retries (more than max_failed_fraction={p.max_failed_fraction}); first "
            f"error: {first}. Without the critic the run would silently train on nothing "
            "(no critiques, or no rewards).")


def make_critique(task_cfg: TaskConfig, p: CritiqueParams, turns: int = 2, critique_correct: bool = False):
    """Round k: critique c_{k-1} of the attempt y_{k-1} (and, in round 1, its reward r0).

    Tasks without a verifier take r0 from the critic's verdict, so round 1 asks about every
    row; a row the critic then fails on gets a NaN reward and is left out of training.
    A learned critic (Bi-NAC) also fills its own columns in round 1; with `critique_correct`
    it critiques correct first answers too, for its own training only (no actor revision)."""
    k = p.round
    learned = p.critic == "learned" and k == 1

    def critique(rows: list[dict]) -> list[dict]:
        task = get_task(task_cfg)
        texts = [attempt_text(r, k) for r in rows]
        ids, step = known([attempt_ids(r, k) for r in rows]), batch_step(rows)
        by_row: dict = {}
        if k == 1:
            scored = score_texts(task, p, rows, texts, list(range(len(rows))), ids, step)
            rows = [{**r, **dict(zip(FIRST_TURN_SCORE, scored[i][0]))} for i, r in enumerate(rows)]
            if not task.has_verifier:  # the critic already judged every attempt
                by_row = {i: (res, err) for i, (_, res, err) in scored.items()}
        tries = [attempt(r, k) for r in rows]
        want = [] if turns == 1 else [i for i, a in enumerate(tries)
                                      if a.live and not (p.early_termination and a.correct)]
        ask = [i for i, a in enumerate(tries) if a.live] if learned and critique_correct else want
        by_row = by_row or ask_critic(p, rows, texts, ask, ids=ids, step=step)
        out = []
        for i, (r, a) in enumerate(zip(rows, tries)):
            res, err = by_row.get(i, (None, ""))
            overflow = bool(res and res.get(OVERFLOW))  # the critic's prompt did not fit: not asked
            res = None if overflow else res
            asked = i in by_row and not overflow
            out.append({**r, round_col("critique", k): res["critique"] if res else "",
                        round_col("critique_asked", k): asked,
                        round_col("critique_failed", k): asked and res is None,
                        round_col("critique_error", k): err,
                        # The verifier wins over the critic's own verdict; disagreements are counted.
                        round_col("critic_disagrees", k): (task.has_verifier and bool(res)
                                                           and bool(res["correct"]) != a.correct),
                        round_col("revised", k): i in want and res is not None,
                        **({c: res[c] for c in empty_critic_columns()} if learned and res
                           else empty_critic_columns() if k == 1 else {}),
                        **({OVERFLOW: overflow} if k == 1 else {})})
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
        step = batch_step(rows)
        scored = score_texts(task, critic, rows, texts, todo, known([r.get(round_col("revision_ids", k)) for r in rows]),
                             step)
        learned = critic_scores(task, rows, step) if k == 1 else []  # the learned critic's revisions
        out = []
        for i, r in enumerate(rows):
            if i in scored:
                score, failed = scored[i][0], not math.isfinite(scored[i][0][0])
            else:  # the episode ended earlier (correct, or the critic failed)
                a = attempt(r, k)
                score, failed = (a.reward, a.correct, a.format_ok), False
            out.append({**r, **{round_col(c, k): v for c, v in zip(SECOND_TURN_SCORE, score)},
                        round_col("reward_asked", k): i in scored and not task.has_verifier,
                        round_col("reward_failed", k): failed})
            if k == 1:
                out[-1].update(learned[i])
        return out

    return reward


def critic_scores(task, rows: list[dict], step: int | None = None) -> list[dict]:
    """Per row, the rewards (and, for the current actor, correctness) of the learned critic's
    revisions, the batch's all scored in one `score_batch` (a learned critic needs a verifier).
    A revision that could not be made (None: its x1 did not fit) scores as the attempt it
    revises, as an overflowed episode of the actor does; its correctness is None (no fix was
    tried, so the fix rate leaves it out)."""
    cols = ("critic_revisions", "critic_reference_revisions")
    made = [(i, col, j) for i, r in enumerate(rows) for col in cols
            for j, t in enumerate(r.get(col) or []) if t is not None]

    def ids_of(i: int, col: str, j: int):
        got = rows[i].get(col.replace("revisions", "revision_ids"))  # the engine's ids, beside the texts
        return got[j] if got else None

    metas = {i: _meta(rows[i]["meta"]) for i, _, _ in made}
    got = task.score_batch([rows[i][col][j] for i, col, j in made], [metas[i] for i, _, _ in made],
                           known([ids_of(*m) for m in made]), step)
    scores = dict(zip(made, got))

    def scored(i: int, col: str) -> list[tuple[float, bool | None]]:
        carried = (float(rows[i]["reward_first"]), None)
        return [(scores[i, col, j].reward, bool(scores[i, col, j].correct)) if t is not None else carried
                for j, t in enumerate(rows[i].get(col) or [])]

    out = []
    for i in range(len(rows)):
        current, reference = scored(i, cols[0]), scored(i, cols[1])
        out.append({"critic_revision_rewards": [r for r, _ in current],
                    "critic_revision_correct": [c for _, c in current],
                    "critic_reference_rewards": [r for r, _ in reference]})
    return out
