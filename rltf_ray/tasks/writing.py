"""Creative writing scored by an LLM judge against a per-prompt rubric.

There is no verifier: the critic (`llm_judge` or `openai`) grades every attempt 1-10, and
the reward is (score - 1) / 9 in [0, 1]. An attempt "passes" (counts as correct, and ends
the episode under early termination) at `pass_score` or above. Without `params.path`, the
project's own 30 prompts are used (JSONL rows: `prompt`, `rubric`).
"""
from __future__ import annotations

import json
from pathlib import Path

from rltf_ray.config import ConfigError
from rltf_ray.tasks.base import ANSWER_TAG, Task, register_task

BUILTIN = Path(__file__).parent / "data" / "writing_prompts.jsonl"


class NoVerifierError(RuntimeError):
    pass


@register_task("writing")
class WritingTask(Task):
    has_verifier = False
    answer_format = "<answer>...</answer>"

    def __init__(self, cfg):
        super().__init__(cfg)
        params = dict(cfg.params)
        path = Path(params.pop("path", BUILTIN))
        self.holdout = int(params.pop("holdout", 5))
        self.pass_score = int(params.pop("pass_score", 8))
        if params:
            raise ConfigError(f"task.params: unknown key '{sorted(params)[0]}' for writing "
                              "(known: path, holdout, pass_score)")
        if not 1 <= self.pass_score <= 10:
            raise ConfigError(f"task.params.pass_score: must be 1..10, got {self.pass_score}")
        if not path.is_file():
            raise ConfigError(f"task.params.path: file not found: {path}")
        self.prompts = []
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or not all(isinstance(row.get(k), str) and row[k].strip()
                                                    for k in ("prompt", "rubric")):
                raise ConfigError(f"{path}:{n}: need non-empty strings 'prompt' and 'rubric'")
            self.prompts.append({"question": row["prompt"], "rubric": row["rubric"]})
        if len(self.prompts) <= self.holdout:
            raise ConfigError(f"{path}: {len(self.prompts)} prompts, need more than holdout={self.holdout}")

    def make_problem(self, index: int, split: str) -> dict:
        train = len(self.prompts) - self.holdout
        i = index % train if split == "train" else train + index % self.holdout
        return {**self.prompts[i], "pass_score": self.pass_score}

    def prompt_text(self, meta: dict) -> str:
        return meta["question"] + "\n\nPut your finished piece inside <answer>...</answer>."

    def extract(self, text: str) -> tuple[str | None, bool]:
        tags = ANSWER_TAG.findall(text)
        return (tags[-1].strip() if tags else text.strip()) or None, bool(tags)

    def check(self, answer: str, meta: dict) -> bool:
        raise NoVerifierError("task 'writing' has no verifier: its rewards come from the critic's "
                              "score (critic: llm_judge or openai)")

    def score(self, text: str, meta: dict):
        return self.check(text, meta)

    def critique(self, text: str, meta: dict) -> str:
        return self.check(text, meta)
