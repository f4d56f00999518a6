"""docs/results.md, "RLTF-FM at the reference's weighting": the registered test and the
format rates. Usage: python docs/scripts/fm_table.py [results/efficiency_corrected]"""
import json
import math
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "results/efficiency_corrected")
runs = {(r["preset"], r["seed"]): r for r in map(json.loads, (root / "runs.jsonl").read_text().splitlines())}
seeds = sorted(s for p, s in runs if p == "rltf_fm.tis")
fm = [runs["rltf_fm.tis", s]["after"]["greedy_accuracy"] for s in seeds]
grpo = [runs["grpo_single.tis", s]["after"]["greedy_accuracy"] for s in seeds]
d = [a - b for a, b in zip(fm, grpo)]
mean = sum(d) / len(d)
se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d)) if len(d) > 1 else float("nan")
t = mean / se if se > 0 else float("inf") if mean > 0 else float("nan")
shown = mean >= 0.10 and t >= 3
print(f"**Test: {'shown' if shown else 'not shown'}** (mean {mean:+.3f}, SE {se:.3f}, t {t:.2f}; "
      f"{len(seeds)} seeds).\n")
print("| | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |")
print("| --- |" + " --- |" * (len(seeds) + 1))


def row(name, vals):
    print(f"| {name} | " + " | ".join(f"{v:.3f}" for v in vals) + f" | {sum(vals) / len(vals):.3f} |")


row("`grpo_single.tis` held-out greedy first try", grpo)
row("`rltf_fm.tis` held-out greedy first try", fm)
row("`rltf_fm.tis − grpo_single.tis`", d)
row("`grpo_single.tis` held-out greedy format rate", [runs["grpo_single.tis", s]["after"]["greedy_format_rate"] for s in seeds])
row("`rltf_fm.tis` held-out greedy format rate", [runs["rltf_fm.tis", s]["after"]["greedy_format_rate"] for s in seeds])
row("`rltf_fm.tis` p1 after (one critique)", [runs["rltf_fm.tis", s]["after"]["feedback_accuracy_1"] for s in seeds])
print("\nThe first answer's format rate in training, by step (`format_first_rate`):\n")
print("| seed | " + " | ".join(f"step {i + 1}" for i in range(8)) + " |")
print("| --- |" + " --- |" * 8)
for s in seeds:
    m = [json.loads(x) for x in (root / "runs" / f"rltf_fm.tis_s{s}" / "metrics.jsonl").read_text().splitlines()]
    print(f"| {s} | " + " | ".join(f"{x['format_first_rate']:.2f}" for x in m) + " |")
