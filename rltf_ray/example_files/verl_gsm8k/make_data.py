"""Writes train.parquet and test.parquet as verl's examples/data_preprocess/gsm8k.py writes
its rows: {data_source, prompt: [chat messages], ability, reward_model: {style, ground_truth},
extra_info: {split, index}}. Generated here: nothing is downloaded.

    python make_data.py [--train 512] [--test 64]"""
import argparse

import pyarrow as pa
import pyarrow.parquet as pq

from word_problems import problems

INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."


def rows(n: int, seed: int, split: str) -> list[dict]:
    return [{"data_source": "openai/gsm8k",
             "prompt": [{"role": "user", "content": f"{q} {INSTRUCTION}"}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(a)},
             "extra_info": {"split": split, "index": i}}
            for i, (q, a) in enumerate(problems(n, seed))]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=512)
    ap.add_argument("--test", type=int, default=64)
    args = ap.parse_args()
    for split, n, seed in (("train", args.train, 0), ("test", args.test, 1)):
        pq.write_table(pa.Table.from_pylist(rows(n, seed, split)), f"{split}.parquet")
        print(f"wrote {split}.parquet ({n} rows)")
