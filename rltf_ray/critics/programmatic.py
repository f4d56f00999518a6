"""The task's own critic: its programmatic score and critique, and the correctness-only
ablation. Plain critics of the contract (no hooks), so also the smallest example of one."""
from __future__ import annotations

from rltf_ray.critics.base import Critic, per_item, register_critic


@register_critic("programmatic")
class ProgrammaticCritic(Critic):
    """Result: {"reward", "correct", "format_ok", "critique"} from `task.score` and
    `task.critique`. Synchronous: the deployment runs it off the replica's event loop, as
    scoring can be CPU-heavy (math-verify, puzzles)."""

    def __init__(self, task):
        self.task = task

    def judge_one(self, item: dict) -> dict:
        s = self.task.score(item["response"], item["meta"])
        return {"reward": s.reward, "correct": s.correct, "format_ok": s.format_ok,
                "critique": self.task.critique(item["response"], item["meta"])}

    def judge(self, items: list[dict]) -> list:
        return per_item(self.judge_one, items)  # an item whose scoring raises fails alone


@register_critic("correctness_only")
class CorrectnessOnlyCritic(ProgrammaticCritic):
    """Ablation: the critique carries only the verdict, no information about the error."""

    def judge_one(self, item: dict) -> dict:
        out = super().judge_one(item)
        out["critique"] = ("Your previous answer was correct." if out["correct"]
                           else "Your previous answer was incorrect.")
        return out
