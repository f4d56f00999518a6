"""Reading one rollout row across critique rounds.

Turn 0 is (x0, y0). Critique round k (1 <= k <= turns-1) adds the critique c_{k-1} of the
attempt y_{k-1}, the prompt x_k = [x0, y0, c0, ..., y_{k-1}, c_{k-1}] and the revision y_k,
in the columns `graph.round_col(name, k)`. A round whose attempt was correct (with early
termination) or whose critique failed is not taken, and neither is any later round.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rltf_ray.graph import round_col


@dataclass(frozen=True)
class Attempt:
    text: str
    reward: float
    correct: bool
    format_ok: bool
    live: bool  # the episode reached this attempt and it has a score (NaN: the judge failed)


@dataclass(frozen=True)
class Revision:
    k: int
    prompt_ids: list[int]  # x_k
    ids: list[int]  # y_k
    reward: float
    correct: bool
    critique: str  # c_{k-1}, the feedback that led to y_k
    judged: str  # y_{k-1}, the attempt that feedback was about

    @property
    def logprobs_column(self) -> str:
        """The column holding the sampler's log-probs of y_k."""
        return round_col("revision_logprobs", self.k)


def attempt_text(row: dict, k: int) -> str:
    """y_{k-1}: the text that critique round `k` judges."""
    return row["response"] if k == 1 else row[round_col("revision", k - 1)]


def attempt_ids(row: dict, k: int) -> list[int] | None:
    """The token ids of y_{k-1} as the engine generated them; None for a row built without
    them (by hand: the pipeline's rows always carry them, its column contract says so)."""
    return row.get("response_ids") if k == 1 else row.get(round_col("revision_ids", k - 1))


def attempt(row: dict, k: int) -> Attempt:
    """The attempt that critique round `k` judges, with its score."""
    if k == 1:
        reward, correct, fmt, reached = row["reward_first"], row["correct_first"], row["format_first"], True
    else:
        j = k - 1
        reward = row[round_col("reward_second", j)]
        correct = row[round_col("correct_second", j)]
        fmt = row[round_col("format_second", j)]
        reached = row[round_col("revised", j)]
    return Attempt(attempt_text(row, k), reward, correct, fmt,
                   bool(reached) and math.isfinite(reward))


def dialogue(row: dict, k: int) -> list[tuple[str, str]]:
    """(y_{j-1}, c_{j-1}) for rounds j = 1..k: the exchanges that make up x_k."""
    return [(attempt_text(row, j), row[round_col("critique", j)]) for j in range(1, k + 1)]


def revisions(row: dict, rounds: int) -> list[Revision]:
    """The revisions this episode actually produced, in order."""
    out = []
    for k in range(1, rounds + 1):
        ids = row.get(round_col("revision_ids", k)) or []
        if not row.get(round_col("revised", k), False) or not ids:
            break
        out.append(Revision(k, list(row.get(round_col("revision_prompt_ids", k)) or []), list(ids),
                            float(row[round_col("reward_second", k)]),
                            bool(row.get(round_col("correct_second", k), False)),
                            row[round_col("critique", k)], attempt_text(row, k)))
    return out

