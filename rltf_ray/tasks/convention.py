"""Arithmetic under a convention that only the critic knows.

"What is 3 ⊕ 7?" -- the prompt never says what ⊕ means, so a first answer is almost never
right and a group of first answers almost never differs in reward (GRPO's advantage is
zero). A wrong answer's critique explains the convention and says in which direction the
answer is off, without giving the result; a revision that applies the convention is right.
This is the regime where text feedback carries information that the scalar reward does
not: what RLTF-SD and RLTF-FM are meant to move into the first answer. It stands for a
house convention (a style, a unit, a format) that reviewers know and the model does not.
"""
from __future__ import annotations

import random

from rltf_ray.errors import ConfigError
from rltf_ray.tasks.arithmetic import Arithmetic
from rltf_ray.tasks.base import Task, register_task

_SPLIT_SALT = {"train": 0, "test": 1_000_003}
SYMBOL = "⊕"

# rule -> (the result, how the critique explains it)
RULES = {
    "concat": (lambda a, b: int(f"{a}{b}"),
               "a ⊕ b is not a sum: it means writing the digits of a followed by the digits of b"),
    "swap": (lambda a, b: int(f"{b}{a}"),
             "a ⊕ b is not a sum: it means writing the digits of b followed by the digits of a"),
    "repeat": (lambda a, b: int(f"{a}{a}"),
               "a ⊕ b is not a sum: it means writing the digits of a twice"),
    "offset": (lambda a, b: a + b + 10, "a ⊕ b means a + b + 10"),
    "double": (lambda a, b: 2 * (a + b), "a ⊕ b means (a + b) × 2"),
}


def in_test_split(a: int, b: int) -> bool:
    """A fixed tenth of the operand pairs is held out: the train and test splits draw from
    disjoint pairs (random draws alone would repeat pairs across splits)."""
    return (a * 131 + b * 31) % 10 == 0


def example(meta: dict) -> str:
    """A worked example of the rule on other numbers than the problem's: it shows how the
    convention works without giving the result."""
    a, b = (2, 5) if (meta["a"], meta["b"]) != (2, 5) else (4, 1)
    return f"{a} {SYMBOL} {b} = {RULES[meta['rule']][0](a, b)}"


@register_task("convention")
class Convention(Arithmetic):
    """Arithmetic's prompt, verifier and demonstration, with ⊕ as the operator."""

    meta_keys = ("a", "b", "op", "rule", "answer")

    def __init__(self, cfg):
        Task.__init__(self, cfg)  # Arithmetic's own params (ops, ...) do not apply
        p = dict(cfg.params)
        # one rule, or a list of rules drawn per problem (a warm start on some rules teaches
        # the use of the critique without teaching the rule a run is measured on)
        rule = p.pop("rule", "concat")
        self.rules = list(rule) if isinstance(rule, (list, tuple)) else [rule]
        self.min_digits = int(p.pop("min_digits", 1))
        self.max_digits = int(p.pop("max_digits", 2))
        if p:
            raise ConfigError(f"task.params: unknown key '{sorted(p)[0]}' for convention "
                              "(known: rule, min_digits, max_digits)")
        bad = [r for r in self.rules if r not in RULES]
        if bad or not self.rules:
            raise ConfigError(f"task.params.rule: expected one of {', '.join(RULES)} (or a list of them), "
                              f"got {rule!r}")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ConfigError("task.params: need 1 <= min_digits <= max_digits")

    def make_problem(self, index: int, split: str) -> dict:
        if split not in _SPLIT_SALT:
            raise ConfigError(f"convention: unknown split {split!r}")
        rng = random.Random(self.cfg.seed * 7_919 + _SPLIT_SALT[split] + index)

        def num():
            d = rng.randint(self.min_digits, self.max_digits)
            return rng.randint(1 if d == 1 else 10 ** (d - 1), 10 ** d - 1)

        a, b = num(), num()
        while in_test_split(a, b) != (split == "test"):  # no held-out pair is ever trained on
            a, b = num(), num()
        rule = self.rules[0] if len(self.rules) == 1 else rng.choice(self.rules)
        return {"a": a, "b": b, "op": SYMBOL, "rule": rule, "answer": RULES[rule][0](a, b)}

    def critique(self, text: str, meta: dict) -> str:
        answer, _ = self.extract(text)
        explain = f"{RULES[meta['rule']][1]}; for example, {example(meta)}"
        if answer is None:
            return (f"Your answer could not be read: end with a plain integer inside "
                    f"<answer></answer>. In this task {explain}.")
        try:
            got = int(answer.strip())
        except ValueError:
            return f"Your final answer is not an integer. In this task {explain}."
        want = int(meta["answer"])
        if got == want:
            return "Your answer is correct."
        direction = "too high" if got > want else "too low"
        return (f"Your answer is incorrect: it is {direction}. In this task {explain}. "
                f"Compute {meta['a']} {SYMBOL} {meta['b']} again with that rule.")
