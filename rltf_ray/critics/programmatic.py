"""The task's own critic: its programmatic score and critique, and the correctness-only
ablation. Plain critics of the contract (no hooks), so also the smallest example of one."""
from __future__ import annotations

from rltf_ray.critics.base import Critic, per_item, register_critic


def score_items(task, items: list[dict]) -> list:
    """The task's Score of each request, one `score_batch` per group of requests that share a
    step and that all carry their token ids ("response_ids", "global_step": the pipeline sends
    both; an HTTP request may send neither), so reward functions are called once per batch."""
    groups: dict[tuple, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault((it.get("global_step"), "response_ids" in it), []).append(i)
    out: list = [None] * len(items)
    for (step, has_ids), which in groups.items():
        got = task.score_batch([items[i]["response"] for i in which], [items[i]["meta"] for i in which],
                               [items[i]["response_ids"] for i in which] if has_ids else None, step)
        for i, s in zip(which, got):
            out[i] = s
    return out


@register_critic("programmatic")
class ProgrammaticCritic(Critic):
    """Result: {"reward", "correct", "format_ok", "critique"} from `task.score_batch` and
    `task.critique_scored`. Synchronous: the deployment runs it off the replica's event loop,
    as scoring can be CPU-heavy (math-verify, puzzles). A batch whose scoring raises is judged
    again one item at a time by the deployment, so only the item that raises fails."""

    def __init__(self, task):
        self.task = task

    def result(self, item: dict, s) -> dict:
        return {"reward": s.reward, "correct": s.correct, "format_ok": s.format_ok,
                "critique": self.task.critique_scored(item["response"], item["meta"], s)}

    def judge(self, items: list[dict]) -> list:
        scores = score_items(self.task, items)
        return per_item(lambda pair: self.result(*pair), list(zip(items, scores)))


@register_critic("correctness_only")
class CorrectnessOnlyCritic(ProgrammaticCritic):
    """Ablation: the critique carries only the verdict, no information about the error."""

    def result(self, item: dict, s) -> dict:
        return {"reward": s.reward, "correct": s.correct, "format_ok": s.format_ok,
                "critique": ("Your previous answer was correct." if s.correct
                             else "Your previous answer was incorrect.")}
