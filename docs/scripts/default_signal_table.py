"""docs/results.md, "Pre-registered: the 256-sample test at matched precision": the registered
tests, each arm's held-out first try by seed, and every run's mismatch, from the run folders.
Only seeds whose runs of both sides of a test have finished enter that test.

    python docs/scripts/default_signal_table.py [results/default_signal]
"""
import json
import math
import statistics
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "results/default_signal")
ARMS = ("grpo_single.fp32", "rltf_sd.fp32", "grpo_single.bf16", "rltf_sd.bf16")


def finished() -> dict:
    """(arm, seed) -> (summary, metrics rows) of every run whose summary.json exists."""
    out = {}
    for d in sorted((root / "runs").glob("*_s*")):
        if d.is_dir() and (d / "summary.json").is_file():
            arm, _, seed = d.name.rpartition("_s")
            rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
            out[arm, int(seed)] = (json.loads((d / "summary.json").read_text()), rows)
    return out


def first_try(run) -> float:
    return run[0]["after"]["greedy_accuracy"]


def test(runs: dict, a: str, b: str, name: str, registered: bool) -> None:
    seeds = sorted(s for arm, s in runs if arm == a and (b, s) in runs)
    d = [first_try(runs[a, s]) - first_try(runs[b, s]) for s in seeds]
    if not d:
        print(f"| {name}: `{a} − {b}` | 0 | | | | | |")
        return
    mean = sum(d) / len(d)
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d)) if len(d) > 1 else float("nan")
    t = mean / se if se > 0 else float("nan")
    verdict = ("shown" if mean >= 0.10 and t >= 3 else "not shown") if registered else ""
    per = ", ".join(f"s{s}: {x:+.3f}" for s, x in zip(seeds, d))
    print(f"| {name}: `{a} − {b}` | {len(d)} | {mean:+.3f} | {se:.3f} | {t:.2f} | {verdict} | {per} |")


def main() -> None:
    runs = finished()
    seeds = sorted({s for _, s in runs})
    print(f"{len(runs)} of {len(ARMS) * 20} runs finished; seeds with any run: {seeds}\n")
    print("| held-out greedy first try after 256 samples | " + " | ".join(f"s{s}" for s in seeds)
          + " | mean ± SE | seeds ≥ 0.5 |")
    print("| --- |" + " --- |" * (len(seeds) + 2))
    for arm in ARMS:
        vals = [first_try(runs[arm, s]) if (arm, s) in runs else None for s in seeds]
        got = [v for v in vals if v is not None]
        se = statistics.stdev(got) / math.sqrt(len(got)) if len(got) > 1 else float("nan")
        cells = " | ".join("" if v is None else f"{v:.3f}" for v in vals)
        summary = f"{statistics.mean(got):.3f} ± {se:.3f}" if got else ""
        print(f"| `{arm}` | {cells} | {summary} | {sum(v >= 0.5 for v in got)} of {len(got)} |")
    print("\n| paired by seed | seeds | mean difference | SE | t | verdict | per seed |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    test(runs, "rltf_sd.fp32", "grpo_single.fp32", "**primary**", True)
    test(runs, "rltf_sd.bf16", "grpo_single.bf16", "secondary", True)
    test(runs, "grpo_single.bf16", "grpo_single.fp32", "secondary", False)
    test(runs, "rltf_sd.bf16", "rltf_sd.fp32", "descriptive", False)
    print("\n| arm | runs | median sampler_kl_k3 per run | largest step | seconds per step (median of runs) | "
          "engine, learner, head | p0 → p1 before |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for arm in ARMS:
        mine = [runs[k] for k in sorted(runs) if k[0] == arm]
        if not mine:
            continue
        med = [statistics.median([m["sampler_kl_k3"] for m in rows if m.get("sampler_kl_k3") is not None])
               for _, rows in mine]
        top = max(m["sampler_kl_k3"] for _, rows in mine for m in rows if m.get("sampler_kl_k3") is not None)
        sec = statistics.median(statistics.mean(m["seconds_step"] for m in rows) for _, rows in mine)
        prov = {(s["provenance"]["engine_dtype"], s["provenance"]["learner_dtype"], s["provenance"]["head_dtype"])
                for s, _ in mine}
        before = {(s["before"]["greedy_accuracy"], s["before"]["feedback_accuracy_1"]) for s, _ in mine}
        print(f"| `{arm}` | {len(mine)} | {min(med):.1e}–{max(med):.1e} | {top:.1e} | {sec:.1f} | "
              f"{'; '.join(', '.join(p) for p in sorted(prov))} | "
              f"{'; '.join(f'{a:.3f} → {b:.3f}' for a, b in sorted(before))} |")
    sha = {json.dumps(s.get("weights_sha256"), sort_keys=True) for s, _ in runs.values()}
    print(f"\nWarm starts in these runs: {len(sha)} distinct")


if __name__ == "__main__":
    main()
