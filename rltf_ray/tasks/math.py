"""Math word problems with \\boxed{} extraction and math-verify checking. One row schema,
wherever the problems come from: the question (`problem` or `question` in `params.path`
rows; the prompt itself in a prompt file) and `answer`. Without `params.path`, the project's
own 50-problem set is used."""
from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
from pathlib import Path

from rltf_ray.errors import ConfigError
from rltf_ray.tasks.base import LAST_NUMBER, FileTask, register_task

BUILTIN = Path(__file__).parent / "data" / "math_small.jsonl"
_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _verify(gold: str, answer: str) -> bool:
    from math_verify import parse, verify

    # The library's own timeouts use signal.alarm, which only works on the main thread; Ray
    # Serve runs user code on worker threads. Off here; `MathTask.check` bounds the time.
    g = parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
    return bool(verify(g, parse(f"\\boxed{{{answer}}}", parsing_timeout=None), timeout_seconds=None))


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" per call
            _POOL = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="math-verify")
        return _POOL


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


def boxed_answers(text: str) -> list[str]:
    """The content of every \\boxed{...} in `text`, in order."""
    out, rest = [], text
    while (found := last_boxed(rest)) is not None:
        out.insert(0, found)
        rest = rest[:rest.rfind("\\boxed{")]
    return out


def _number(text: str) -> float | None:
    """`text` as a finite number ("1,200", "$5", "3/4"), or None."""
    text = text.replace(",", "").replace("$", "").strip()
    num, _, den = text.partition("/")
    try:
        value = float(num) / float(den) if den else float(text)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return value if math.isfinite(value) else None  # "inf", "nan", 400 digits: no number to compare


def numeric_hint(answer: str, gold: str) -> str:
    """What a wrong answer's number says about the mistake, against a numeric reference: the
    sign, a power of ten (units), rounding, an integer expected, else too large or too small.
    "" when either is not a number."""
    a, g = _number(answer), _number(gold)
    if a is None:
        return " Give the answer as a single number." if g is not None else ""
    if g is None or a == g:
        return ""
    if g != 0 and a == -g:
        return " Check the sign."
    for k in (10, 100, 1000):
        if g != 0 and (abs(a - g * k) <= 1e-9 * abs(g * k) or abs(a * k - g) <= 1e-9 * abs(g)):
            return " It is off by a power of ten: check the units and the place value."
    if g != 0 and abs(a - g) <= 0.01 * abs(g):
        return " It is close: do not round, and keep the exact value."
    if g == int(g) and a != int(a):
        return " The answer is a whole number."
    return " It is too large." if a > g else " It is too small."


@register_task("math")
class MathTask(FileTask):
    answer_format = "\\boxed{...}"
    meta_keys = ("answer",)  # a prompt file's row: its prompt is the question

    builtin = BUILTIN
    row_schema = "need 'problem' (or 'question', a string) and 'answer'"
    extra_params = ("verify_timeout_s",)
    verify_timeout_s = 10.0
    timeouts = 0  # answers judged wrong because the verifier ran out of time

    def configure(self, params: dict) -> None:
        self.verify_timeout_s = float(params.get("verify_timeout_s", self.verify_timeout_s))
        if self.verify_timeout_s <= 0:
            raise ConfigError("task.params.verify_timeout_s: must be > 0")

    def __init__(self, cfg):
        super().__init__(cfg)
        try:
            import math_verify  # noqa: F401
        except ImportError as e:
            raise ConfigError("math-verify is not installed; run `make install`") from e

    def parse_row(self, row: dict) -> dict | None:
        question = row.get("problem", row.get("question"))
        if not isinstance(question, str) or row.get("answer") is None:
            return None
        return {"question": question, "answer": str(row["answer"])}

    def prompt_text(self, meta: dict) -> str:
        return meta["question"] + "\n\nReason step by step and put your final answer in \\boxed{}."

    def extract(self, text: str) -> tuple[str | None, bool]:
        boxed = last_boxed(text)
        if boxed is not None or self.cfg.extraction == "tag":
            return boxed, boxed is not None
        nums = LAST_NUMBER.findall(text)
        return (nums[-1].replace(",", "") if nums else None), False

    def check(self, answer: str, meta: dict) -> bool:
        """math-verify equivalence, safe on any thread. An answer the verifier cannot settle
        within `verify_timeout_s` counts as wrong (sympy can run for minutes on hostile input);
        its thread is left to finish in the background and the case is counted."""
        fut = _pool().submit(_verify, str(meta["answer"]), answer)
        try:
            return fut.result(timeout=self.verify_timeout_s)
        except concurrent.futures.TimeoutError:
            self.timeouts += 1
            logging.getLogger(__name__).warning("math verifier timed out after %.0fs on %r",
                                                self.verify_timeout_s, answer[:200])
            return False

    def critique(self, text: str, meta: dict) -> str:
        answer, _ = self.extract(text)
        return self._critique(text, meta, answer is not None and self.check(answer, meta))

    def critique_scored(self, text: str, meta: dict, score) -> str:
        # the verdict is the score's: math-verify (up to verify_timeout_s) is not run twice
        return self._critique(text, meta, score.correct)

    def _critique(self, text: str, meta: dict, correct: bool) -> str:
        # A verifier cannot explain the reasoning (that is an LLM judge's job), but it can say
        # what about the final answer is off, which helps a revision more than "incorrect".
        answer, _ = self.extract(text)
        if answer is None:
            return "Your answer could not be read. Put your final answer inside \\boxed{}."
        if correct:
            return "Your answer is correct."
        boxed = boxed_answers(text)
        several = (f" You boxed {len(set(boxed))} different answers; box exactly one."
                   if len(set(boxed)) > 1 else "")
        return f"Your answer {answer} is incorrect.{several}{numeric_hint(answer, str(meta['answer']))}"
