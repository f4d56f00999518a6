"""Creative writing scored by an LLM judge against a per-prompt rubric.

There is no verifier: the critic (`llm_judge` or `openai`) grades every attempt 1-10, and
the reward is (score - 1) / 9 in [0, 1]. An attempt "passes" (counts as correct, and ends
the episode under early termination) at `pass_score` or above. Without `params.path`, the
project's own 30 prompts are used (JSONL rows: `prompt`, `rubric`).
"""
from __future__ import annotations

from pathlib import Path

from rltf_ray.errors import ConfigError
from rltf_ray.tasks.base import FileTask, last_tagged, register_task

BUILTIN = Path(__file__).parent / "data" / "writing_prompts.jsonl"


class NoVerifierError(RuntimeError):
    pass


@register_task("writing")
class WritingTask(FileTask):
    has_verifier = False
    meta_keys = ("question", "rubric")
    answer_format = "<answer>...</answer>"

    builtin = BUILTIN
    default_holdout = 5
    extra_params = ("pass_score",)
    row_schema = "need non-empty strings 'prompt' and 'rubric'"

    def configure(self, params: dict) -> None:
        self.pass_score = int(params.get("pass_score", 8))
        if not 1 <= self.pass_score <= 10:
            raise ConfigError(f"task.params.pass_score: must be 1..10, got {self.pass_score}")

    def parse_row(self, row: dict) -> dict | None:
        if not all(isinstance(row.get(k), str) and row[k].strip() for k in ("prompt", "rubric")):
            return None
        return {"question": row["prompt"], "rubric": row["rubric"]}

    def make_problem(self, index: int, split: str) -> dict:
        return {**super().make_problem(index, split), "pass_score": self.pass_score}

    def prompt_text(self, meta: dict) -> str:
        return meta["question"] + "\n\nPut your finished piece inside <answer>...</answer>."

    def extract(self, text: str) -> tuple[str | None, bool]:
        tagged = last_tagged(text)
        return (text if tagged is None else tagged).strip() or None, tagged is not None

    def check(self, answer: str, meta: dict) -> bool:
        raise NoVerifierError("task 'writing' has no verifier: its rewards come from the critic's "
                              "score (critic: llm_judge or openai)")

    def score(self, text: str, meta: dict):
        return self.check(text, meta)

    def critique(self, text: str, meta: dict) -> str:
        return self.check(text, meta)
