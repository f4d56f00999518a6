"""Writes train.jsonl and test.jsonl shaped as TRL's GSM8K examples shape theirs: a
conversational `prompt` and a `solution` column (the final number), every other column passed
to the reward functions by name. Generated here: nothing is downloaded.

    python make_data.py [--train 512] [--test 64]"""
import argparse
import json

from word_problems import problems

SYSTEM = ("Solve the problem step by step. Put your reasoning in <think> </think> and the final "
          "number in <answer> </answer>.")


def rows(n: int, seed: int) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
             "solution": str(a)} for q, a in problems(n, seed)]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=512)
    ap.add_argument("--test", type=int, default=64)
    args = ap.parse_args()
    for name, n, seed in (("train", args.train, 0), ("test", args.test, 1)):
        with open(f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows(n, seed))
        print(f"wrote {name}.jsonl ({n} rows)")
