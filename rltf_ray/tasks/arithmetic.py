"""Multi-digit addition and multiplication with an exact verifier and a critique that
locates the error without revealing the result."""
from __future__ import annotations

import random

from rltf_ray.errors import ConfigError
from rltf_ray.tasks.base import Task, register_task

ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
            "ninth", "tenth"]
_SPLIT_SALT = {"train": 0, "test": 1_000_003}


@register_task("arithmetic")
class Arithmetic(Task):
    meta_keys = ("a", "b", "op", "answer")

    def __init__(self, cfg):
        super().__init__(cfg)
        p = dict(cfg.params)
        self.min_digits = int(p.pop("min_digits", 1))
        self.max_digits = int(p.pop("max_digits", 2))
        self.ops = tuple(p.pop("ops", ["+", "*"]))
        if p:
            raise ConfigError(f"task.params: unknown key '{sorted(p)[0]}' for arithmetic "
                              "(known: min_digits, max_digits, ops)")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ConfigError("task.params: need 1 <= min_digits <= max_digits")
        if not self.ops or any(o not in ("+", "*") for o in self.ops):
            raise ConfigError(f"task.params.ops: use '+' and/or '*', got {list(self.ops)}")

    def make_problem(self, index: int, split: str) -> dict:
        if split not in _SPLIT_SALT:
            raise ConfigError(f"arithmetic: unknown split {split!r}")
        rng = random.Random(self.cfg.seed * 7_919 + _SPLIT_SALT[split] + index)

        def num():
            d = rng.randint(self.min_digits, self.max_digits)
            return rng.randint(0 if d == 1 else 10 ** (d - 1), 10 ** d - 1)

        a, b, op = num(), num(), rng.choice(self.ops)
        return {"a": a, "b": b, "op": op, "answer": a + b if op == "+" else a * b}

    def prompt_text(self, meta: dict) -> str:
        return (f"What is {meta['a']} {meta['op']} {meta['b']}? "
                f"Give the final answer as <answer>number</answer>.")

    def demonstration(self, meta: dict) -> str:
        return f"{meta['a']} {meta['op']} {meta['b']} = {meta['answer']}. <answer>{meta['answer']}</answer>"

    def check(self, answer: str, meta: dict) -> bool:
        try:
            return int(answer.strip()) == int(meta["answer"])
        except ValueError:
            return False

    def critique(self, text: str, meta: dict) -> str:
        answer, _ = self.extract(text)
        if answer is None:
            return ("Your answer could not be read: end with the result as a plain integer "
                    "inside <answer></answer>, for example <answer>42</answer>.")
        try:
            got = int(answer.strip())
        except ValueError:
            return "Your final answer is not an integer. Put only the integer inside <answer></answer>."
        want = int(meta["answer"])
        if got == want:
            return "Your answer is correct."
        direction = "too high" if got > want else "too low"
        g, w = str(abs(got)), str(abs(want))
        if (got < 0) != (want < 0):
            where = "Its sign is wrong."
        elif len(g) != len(w):
            where = f"It has too {'many' if len(g) > len(w) else 'few'} digits."
        else:
            pos = next(i for i in range(len(w)) if g[i] != w[i])
            name = ORDINALS[pos] if pos < len(ORDINALS) else f"{pos + 1}th"
            where = f"The {name} digit from the left is the first one that is wrong."
        return f"Your answer is incorrect: it is {direction}. {where} Recompute step by step."
