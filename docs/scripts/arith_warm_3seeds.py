"""docs/results.md section 2: seeds 0-1 (recorded in docs/results.md on 2026-11-30; their run folders were not retained)
plus seed 2 (results/arith_warm_s2): mean ± SE over 3 seeds, per-seed rows, and the curves."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from rltf_ray.evaluation import mean_se
from rltf_ray.report import collect_run, write_curves

# held-out greedy accuracy at 0, 128, 256 first-turn samples, from docs/results.md
RECORDED = {
    "grpo_single": [(0.453, 0.641, 0.609), (0.453, 0.766, 0.797)],
    "grpo_multi": [(0.453, 0.719, 0.516), (0.453, 0.547, 0.766)],
    "rltf_sd": [(0.453, 0.703, 0.641), (0.453, 0.781, 0.766)],
    "rltf_fm": [(0.453, 0.734, 0.734), (0.453, 0.781, 0.703)],
    "rltf_sd_fm": [(0.453, 0.719, 0.734), (0.453, 0.750, 0.781)],
}
runs, rows = [], []
for preset, seeds in RECORDED.items():
    curves = [[round(v * 64) / 64 for v in c] for c in seeds]  # each is k of 64 problems
    out = ROOT / f"results/arith_warm_s2/runs/{preset}_s2"
    if (out / "summary.json").is_file():
        r = collect_run(out, preset, 2)
        pts = {p["samples_seen"]: p["greedy_accuracy"] for p in r["curve"]}
        curves.append([pts[0], pts[128], pts[256]])
    for s, c in enumerate(curves):
        runs.append({"preset": preset, "seed": s, "curve": [{"samples_seen": x, "greedy_accuracy": y}
                                                             for x, y in zip((0, 128, 256), c)]})
    after = [c[2] for c in curves]
    m, se = mean_se(after)
    ch = mean_se([c[2] - c[0] for c in curves])
    rows.append(f"| {preset} | {len(curves)} | {m:.3f} ± {se:.3f} | {ch[0]:+.3f} ± {ch[1]:.3f} | "
                + " | ".join(f"{c[0]:.3f} → {c[1]:.3f} → {c[2]:.3f}" for c in curves) + " |")
print("| preset | seeds | held-out acc after (greedy) | change | seed 0 | seed 1 | seed 2 |")
print("| --- | --- | --- | --- | --- | --- | --- |")
print("\n".join(rows))
write_curves(runs, ROOT / "docs/img/arith_warm_3seeds.png", title="arith_warm: held-out greedy accuracy")
