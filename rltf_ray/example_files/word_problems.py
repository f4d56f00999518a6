"""GSM8K-shaped word problems, generated: a question in words and its whole-number answer.
Shared by both worked examples' make_data.py (copied beside them): nothing is downloaded."""
import random

TEMPLATES = [
    ("A baker makes {a} loaves every morning and {b} every afternoon. How many loaves does she "
     "make in {c} days?", lambda a, b, c: (a + b) * c),
    ("Tom has {a} marbles. He gives {b} to his sister and then buys {c} more. How many marbles "
     "does he have now?", lambda a, b, c: a - b + c),
    ("A box holds {a} pencils. A school orders {b} boxes and hands out {c} pencils. How many "
     "pencils are left?", lambda a, b, c: a * b - c),
    ("Maria reads {a} pages a day for {b} days, then {c} pages on the last day. How many pages "
     "did she read in all?", lambda a, b, c: a * b + c),
    ("A farmer has {a} rows of {b} apple trees and plants {c} more trees. How many apple trees "
     "does he have?", lambda a, b, c: a * b + c),
    ("A ticket costs {a} dollars. A group of {b} people pays with {c} ten-dollar bills. How much "
     "change do they get?", lambda a, b, c: 10 * c - a * b),
]


def problem(rng: random.Random) -> tuple[str, int]:
    """One question and its answer; every answer is a positive whole number."""
    while True:
        text, answer = rng.choice(TEMPLATES)
        a, b, c = rng.randint(2, 12), rng.randint(2, 9), rng.randint(1, 20)
        value = answer(a, b, c)
        if value > 0:
            return text.format(a=a, b=b, c=c), value


def problems(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [problem(rng) for _ in range(n)]
