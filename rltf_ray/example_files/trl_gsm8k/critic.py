"""A critic that sees the reference solution: for a wrong answer it says what is off about the
final number (too large, too small, a power of ten, the sign) or the format, never the number
itself. A plugin: `plugins: [critic.py]` and `pipeline.critic.critic: reference_critic`."""
import re

import rltf_ray
from rltf_ray.tasks.math import numeric_hint

ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


@rltf_ray.register_critic("reference_critic")
class ReferenceCritic:
    def __init__(self, task):
        self.task = task  # scores with the run's reward functions

    def critique(self, response: str, solution: str) -> str:
        found = ANSWER.findall(response)
        if not found:
            return "Your answer has no <answer> </answer> tags. End with <answer>the number</answer>."
        answer = found[-1].replace(",", "").strip()
        hint = numeric_hint(answer, solution).strip() or "Recheck each step."
        return f"Your final answer {answer} is wrong. {hint} Work through the problem again step by step."

    def judge(self, items):
        scores = rltf_ray.critics.score_items(self.task, items)
        return [{"reward": s.reward, "correct": s.correct, "format_ok": s.format_ok,
                 "critique": "Your answer is correct." if s.correct
                 else self.critique(it["response"], str(it["meta"]["solution"]))}
                for it, s in zip(items, scores)]
