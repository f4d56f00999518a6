"""docs/results.md section 3: Knights and Knaves over every finished run in results/kk_warm
(compare.py's own table needs every preset to have the same seeds): the mean ± SE table,
per-seed curves, paired differences, and the figure docs/img/kk_warm.png.

    .venv/bin/python docs/scripts/kk_warm_table.py"""
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from rltf_ray.evaluation import mean_se  # noqa: E402
from rltf_ray.report import collect_run, write_curves, write_table  # noqa: E402

ORDER = ("grpo_single", "grpo_multi", "rltf_sd", "rltf_fm", "rltf_sd_fm")
root = ROOT / "results" / "kk_warm"
runs = []
for d in sorted((root / "runs").iterdir()):
    if d.is_dir() and (d / "summary.json").is_file():
        preset, seed = d.name.rsplit("_s", 1)
        runs.append(collect_run(d, preset, int(seed)))
runs.sort(key=lambda r: (ORDER.index(r["preset"]), r["seed"]))
with open(root / "runs.jsonl", "w") as f:
    for r in runs:
        f.write(json.dumps(r) + "\n")
print(write_table(runs, root / "table.md",
                  title="kk_warm: pipelines/configs/knights_warm.yaml run.steps=4 run.eval_every=2"))
write_curves(runs, root / "curves.png", title="kk_warm")
shutil.copy(root / "curves.png", ROOT / "docs" / "img" / "kk_warm.png")

curves = {}
for r in runs:
    pts = {p["samples_seen"]: p["greedy_accuracy"] for p in r["curve"]}
    curves.setdefault(r["preset"], {})[r["seed"]] = [pts[0], pts[64], pts[128]]
presets = [p for p in ORDER if p in curves]
print("\n| preset | seed 0 (0 → 64 → 128 samples) | seed 1 | seed 2 |\n| --- | --- | --- | --- |")
for p in presets:
    print(f"| {p} | " + " | ".join("{:.3f} → {:.3f} → {:.3f}".format(*curves[p][s])
                                   for s in sorted(curves[p])) + " |")
print()
for base in ("grpo_single", "grpo_multi"):
    for p in presets:
        seeds = sorted(set(curves[p]) & set(curves.get(base, {})))
        if p != base and seeds:
            d = [curves[p][s][2] - curves[base][s][2] for s in seeds]
            m, se = mean_se(d)
            spread = f"SE {se:.3f} ({len(d)} seeds)" if len(d) > 1 else "one seed, no SE"
            print(f"{p} − {base}, paired by seed: {', '.join(f'{x:+.3f}' for x in d)}; mean {m:+.3f}, {spread}")
