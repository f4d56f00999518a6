"""Math word problems from a JSONL file (`problem`, `answer`), with \\boxed{} extraction and
math-verify checking. Without `params.path`, the project's own 50-problem set is used."""
from __future__ import annotations

from pathlib import Path

from rltf_ray.config import ConfigError
from rltf_ray.tasks.base import LAST_NUMBER, FileTask, register_task

BUILTIN = Path(__file__).parent / "data" / "math_small.jsonl"


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, with nested braces."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


@register_task("math")
class MathTask(FileTask):
    answer_format = "\\boxed{...}"

    builtin = BUILTIN
    row_schema = "need 'problem' (string) and 'answer'"

    def __init__(self, cfg):
        super().__init__(cfg)
        try:
            import math_verify  # noqa: F401
        except ImportError as e:
            raise ConfigError("math-verify is not installed; run `make install`") from e

    def parse_row(self, row: dict) -> dict | None:
        if not isinstance(row.get("problem"), str) or "answer" not in row:
            return None
        return {"question": row["problem"], "answer": str(row["answer"])}

    def prompt_text(self, meta: dict) -> str:
        return meta["question"] + "\n\nReason step by step and put your final answer in \\boxed{}."

    def extract(self, text: str) -> tuple[str | None, bool]:
        boxed = last_boxed(text)
        if boxed is not None or self.cfg.extraction == "tag":
            return boxed, boxed is not None
        nums = LAST_NUMBER.findall(text)
        return (nums[-1].replace(",", "") if nums else None), False

    def check(self, answer: str, meta: dict) -> bool:
        from math_verify import parse, verify

        gold = parse(f"\\boxed{{{meta['answer']}}}")
        return bool(verify(gold, parse(f"\\boxed{{{answer}}}")))

    def critique(self, text: str, meta: dict) -> str:
        # A verifier cannot explain a math error; explanations are the LLM judge's job.
        answer, _ = self.extract(text)
        if answer is None:
            return "Your answer could not be read. Put your final answer inside \\boxed{}."
        return "Your answer is correct." if self.check(answer, meta) else "Your answer is incorrect."
