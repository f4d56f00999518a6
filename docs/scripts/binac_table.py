"""The tables of "Pre-registered: Bi-NAC where the critic has room to learn" and of its
follow-up "...: room and a signal" (docs/results.md), from the committed run folders alone.

    python docs/scripts/binac_table.py results/binac_learnable
    python docs/scripts/binac_table.py results/binac_signal

System score: the held-out accuracy after the run's own critic critiques a wrong greedy first
answer once and the actor revises greedily (`after.feedback_accuracy_1`); for `grpo_single`,
which has no critic, its first try. Every difference is paired by seed, among runs that share
one pair of warm-start weights; a run stopped by a guard is listed, not paired. The critic's
registered secondary, its fix rate rising more under a learned critic than under the frozen
one, is paired the same way.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rltf_ray.evaluation import mean_se  # noqa: E402
from rltf_ray.report import finished_runs, stopped_runs  # noqa: E402

SHOWN = (0.10, 3.0)
SEEDS = 3  # registered: a difference is judged only on all of them
CRITIC_PRESETS = ("fixed_critic", "binac_no_bilevel", "binac")
TESTS = [  # (what, preset, its endpoint, baseline, the baseline's endpoint)
    ("primary", "binac", "system", "fixed_critic", "system"),
    ("secondary", "binac_no_bilevel", "system", "fixed_critic", "system"),
    ("secondary", "binac", "system", "binac_no_bilevel", "system"),
    ("secondary (Figure 1)", "binac", "system", "grpo_single", "first"),
    ("secondary", "binac", "first", "fixed_critic", "first"),
    ("secondary", "binac_no_bilevel", "first", "fixed_critic", "first"),
    ("secondary", "grpo_single", "first", "fixed_critic", "first"),
]


def endpoint(run: dict, which: str, when: str = "after") -> float | None:
    got = run.get(when) or {}
    if which == "system" and run["preset"] in CRITIC_PRESETS:
        return got.get("feedback_accuracy_1")
    return got.get("greedy_accuracy")


def same_weights(a: dict, b: dict) -> bool:
    """Whether two runs started from one actor warm start (and one critic, where both have one)."""
    wa, wb = a.get("weights_sha256") or {}, b.get("weights_sha256") or {}
    return wa.get("actor") == wb.get("actor") and (
        "critic" not in wa or "critic" not in wb or wa["critic"] == wb["critic"])


def halves(values: list[float]) -> tuple[float, float]:
    half = len(values) // 2
    return mean_se(values[:half])[0], mean_se(values[half:])[0]


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "results/binac_learnable")
    runs = {(r["preset"], r["seed"]): r for r in finished_runs(root)}
    print(f"{len(runs)} finished runs in {root}")
    print("\n| test | difference | endpoints | seeds | mean | SE | t | per seed | shown |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for what, a, ea, b, eb in TESTS:
        seeds, diffs = paired(runs, a, b, lambda r, e=ea: endpoint(r, e), lambda r, e=eb: endpoint(r, e))
        m, se = mean_se(diffs)
        t = m / se if len(diffs) > 1 and se > 0 else float("nan")
        ok = len(diffs) >= SEEDS and m >= SHOWN[0] and t >= SHOWN[1]
        per = ", ".join(f"s{s}: {d:+.3f}" for s, d in zip(seeds, diffs))
        print(f"| {what} | `{a}` − `{b}` | {ea} − {eb} | {len(seeds)} | {m:+.3f} | "
              f"{se:.3f} | {t:.2f} | {per} | {'yes' if ok else 'no'} |")
    rise_test(runs)
    print("\n| preset | seeds | system score after | first try after | critic fix rate, 1st half | 2nd half "
          "| critic reward, 1st half | 2nd half | identical pairs | minutes / run |\n" + "| --- " * 10 + "|")
    for preset in ("grpo_single", *CRITIC_PRESETS):
        rs = [r for (p, _), r in sorted(runs.items()) if p == preset]
        if not rs:
            continue

        def cell(values):
            values = [v for v in values if v is not None]
            m, se = mean_se(values)
            return f"{m:.3f} ± {se:.3f}" if values else "-"

        steps = [read_steps(r) for r in rs]
        fix = [r["critic_fix_rate_halves"] or [None, None] for r in rs]
        rew = [halves([m["critic_reward_mean"] for m in st if m.get("critic_trained")]) for st in steps]
        ident = [mean_se(got)[0] if (got := [m["critic_identical_pair_fraction"] for m in st
                                              if m.get("critic_identical_pair_fraction") is not None]) else None
                 for st in steps]
        learned = preset in ("binac", "binac_no_bilevel")
        print(f"| `{preset}` | {len(rs)} | {cell([endpoint(r, 'system') for r in rs])} | "
              f"{cell([endpoint(r, 'first') for r in rs])} | {cell([f[0] for f in fix])} | "
              f"{cell([f[1] for f in fix])} | {cell([h[0] for h in rew]) if learned else '-'} | "
              f"{cell([h[1] for h in rew]) if learned else '-'} | {cell(ident) if learned else '-'} | "
              f"{cell([r['seconds'] / 60 for r in rs])} |")
    print("\nEach run, held-out before and after training (the system score before is the frozen critic's).\n\n"
          "| run | first try before → after | system score before → after | critic fix rate, 1st / 2nd half |\n"
          + "| --- " * 4 + "|")

    def num(x):
        return "–" if x is None else f"{x:.3f}"

    for (preset, seed), r in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        fix = r.get("critic_fix_rate_halves") or [None, None]
        print(f"| `{preset}` s{seed} | {num(endpoint(r, 'first', 'before'))} → {num(endpoint(r, 'first'))} | "
              f"{num(endpoint(r, 'system', 'before'))} → {num(endpoint(r, 'system'))} | "
              f"{num(fix[0])} / {num(fix[1])} |")
    print("\nEach learned-critic run's critic updates: the share of update groups whose K critiques "
          "all earned the same reward (no gradient), averaged over the updates.\n\n"
          "| run | critic updates | zero-advantage share, mean | min | max | below 0.5 |\n" + "| --- " * 6 + "|")
    for (preset, seed), r in sorted(runs.items()):
        if preset not in ("binac", "binac_no_bilevel"):
            continue  # only a learned critic has updates; no need to read the others' metrics
        zero = [m["critic_zero_advantage_fraction"] for m in read_steps(r)
                if m.get("critic_trained") and m.get("critic_zero_advantage_fraction") is not None]
        if zero:
            m = sum(zero) / len(zero)
            print(f"| `{preset}` s{seed} | {len(zero)} | {m:.3f} | {min(zero):.3f} | {max(zero):.3f} | "
                  f"{'yes' if m < 0.5 else 'no'} |")
    stopped = stopped_runs(root)
    if stopped:
        print("\nStopped by a guard:\n" + "\n".join(stopped))
    return 0


def paired(runs: dict, a: str, b: str, value_a, value_b) -> tuple[list[int], list[float]]:
    """The seeds where presets `a` and `b` both finished from one pair of warm starts and both
    values exist, and `value_a(run a) - value_b(run b)` on each."""
    seeds = sorted(s for (p, s) in runs if p == a and (b, s) in runs
                   and same_weights(runs[a, s], runs[b, s])
                   and None not in (value_a(runs[a, s]), value_b(runs[b, s])))
    return seeds, [value_a(runs[a, s]) - value_b(runs[b, s]) for s in seeds]


def fix_rate_rise(run: dict) -> float | None:
    first, second = run.get("critic_fix_rate_halves") or [None, None]
    return None if None in (first, second) else second - first


def rise_test(runs: dict) -> None:
    """The registered secondary on the critic: its training fix rate rises from the first half to
    the second by more under `binac` than under `fixed_critic`, paired by seed."""
    print("\n| test | difference | seeds | mean | SE | per seed |\n" + "| --- " * 6 + "|")
    for preset in ("binac", "binac_no_bilevel"):
        seeds, diffs = paired(runs, preset, "fixed_critic", fix_rate_rise, fix_rate_rise)
        m, se = mean_se(diffs)
        per = ", ".join(f"s{s}: {d:+.3f}" for s, d in zip(seeds, diffs))
        print(f"| secondary (critic) | fix-rate rise, `{preset}` − `fixed_critic` | {len(seeds)} | "
              f"{m:+.3f} | {se:.3f} | {per} |")


def read_steps(run: dict) -> list[dict]:
    from rltf_ray.report import read_metrics

    return read_metrics(Path(run["output_dir"]))


if __name__ == "__main__":
    sys.exit(main())
