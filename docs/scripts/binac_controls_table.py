"""The tables of the registered Bi-NAC controls, discovery regime and lag arm
(docs/registrations/binac_controls.md), from the committed records alone.

    python docs/scripts/binac_controls_table.py results/binac_controls            # controls and the lag arm
    python docs/scripts/binac_controls_table.py results/binac_controls --choice   # prints "T_frozen T_trained"
    python docs/scripts/binac_controls_table.py results/binac_discovery --discovery

Records: the run folders (`runs/<preset>[.<variant>]_s<seed>/`, summary.json and metrics.jsonl)
and the evaluations of saved checkpoint pairs (`evals/<split>/<actor>__<critic>__<t>_s<seed>.json`,
written by `pipelines/eval.py --output`): `<actor>` is the run whose final actor answers
(`binac`, `fixed_critic.t0`, ...), `<critic>` is `trained` (that seed's `binac` critic) or
`frozen` (the critic warm start), `<t>` the critic's temperature (t0 greedy, t05, t1).

The system score is `feedback_accuracy_1`: the actor's greedy answer, one critique of a wrong one
by the critic at its temperature, the actor's greedy revision. A run that a guard stopped has no
final weights: it counts against its method at its last held-out evaluation's system score, or 0
without one (`rltf_ray.report.stopped_endpoint`), at every temperature, never as absent.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rltf_ray.evaluation import mean_se  # noqa: E402
from rltf_ray.report import finished_runs, guard_stopped_runs, stopped_endpoint  # noqa: E402

SEEDS = (0, 1, 2)  # registered: every test is judged on all three
TEMPS = (0.0, 0.5, 1.0)
TAG = {0.0: "t0", 0.5: "t05", 1.0: "t1"}
SHOWN = (0.10, 3.0)
KEY = "feedback_accuracy_1"


def load_runs(root: Path) -> dict:
    """{(preset, seed): record}: finished runs, and runs a guard stopped (`stopped` set)."""
    runs = {(r["preset"], r["seed"]): r for r in finished_runs(root)}
    for r in guard_stopped_runs(root):
        runs[(r["preset"], r["seed"])] = {**r, "stopped": True}
    return runs


def run_system(run: dict | None) -> float | None:
    """A run's own system score after training (its critic at the run's temperature)."""
    if run is None:
        return None
    if run.get("stopped"):
        return stopped_endpoint(run, KEY)
    return (run.get("after") or {}).get(KEY)


def load_evals(root: Path) -> dict:
    """{(split, actor, critic, temperature, seed): system score or None (unmeasured)}."""
    out = {}
    for f in sorted(Path(root, "evals").glob("*/*__*__t*_s*.json")):
        actor, critic, rest = f.stem.split("__")
        tag, _, seed = rest.rpartition("_s")
        temp = {v: k for k, v in TAG.items()}[tag]
        out[(f.parent.name, actor, critic, temp, int(seed))] = json.loads(f.read_text()).get(KEY)
    return out


def score(runs: dict, evals: dict, split: str, actor: str, critic: str, temp: float, seed: int) -> float | None:
    """The system score of `actor`'s final weights with `critic` at `temp` on `split`: the
    evaluation of the saved pair; on the held-out split a run's own after-evaluation where the
    pair and the temperature are the run's own. A run that a guard stopped left no final
    weights: its own pair (actor and critic of one run) scores its endpoint at every temperature,
    and a pair that mixes its weights with another run's is unmeasured (None)."""
    own_run = actor if (actor == "binac") == (critic == "trained") else None
    for part in {actor, "binac" if critic == "trained" else actor}:
        run = runs.get((part, seed))
        if run is not None and run.get("stopped"):
            return stopped_endpoint(run, KEY) if part == own_run else None
    got = evals.get((split, actor, critic, temp, seed))
    if got is None and split == "test":
        own = {"binac": ("trained", 1.0), **{f"fixed_critic.{TAG[t]}": ("frozen", t) for t in TEMPS}}.get(actor)
        if own == (critic, temp):
            got = run_system(runs.get((actor, seed)))
    return got


def choose(per_temp: dict) -> float | None:
    """The temperature whose calibration system score, averaged over the registered seeds, is
    highest; a tie (to 3 decimals) goes to the higher temperature; None while any is missing."""
    if any(len([v for v in vs if v is not None]) < len(SEEDS) for vs in per_temp.values()):
        return None
    return max(per_temp, key=lambda t: (round(sum(per_temp[t]) / len(per_temp[t]), 3), t))


def choices(runs: dict, evals: dict) -> tuple[float | None, float | None]:
    """(the frozen critic's temperature, the trained critic's), each chosen on the calibration split."""
    frozen = {t: [score(runs, evals, "calibration", f"fixed_critic.{TAG[t]}", "frozen", t, s) for s in SEEDS]
              for t in TEMPS}
    trained = {t: [score(runs, evals, "calibration", "binac", "trained", t, s) for s in SEEDS] for t in TEMPS}
    return choose(frozen), choose(trained)


def test_row(diffs: dict) -> dict:
    """Mean, SE, t and the verdict of per-seed differences {seed: value or None}: shown only
    with every registered seed, a mean >= +0.10 and t >= 3."""
    have = [diffs[s] for s in SEEDS if diffs.get(s) is not None]
    m, se = mean_se(have)
    t = m / se if len(have) > 1 and se > 0 else (math.inf if len(have) > 1 and m > 0 else math.nan)
    shown = len(have) == len(SEEDS) and m >= SHOWN[0] and t >= SHOWN[1]
    return {"seeds": len(have), "mean": m, "se": se, "t": t, "per_seed": diffs,
            "shown": "yes" if shown else "no" if len(have) == len(SEEDS) else
            f"not decided ({len(SEEDS) - len(have)} of {len(SEEDS)} seeds unmeasured)"}


def split_gain(runs: dict, evals: dict, tf: float, tb: float) -> dict:
    """The primary's gain split between the critic and the actor, per seed, from the 2 x 2 of
    actors (trained `binac`, frozen-run `fixed_critic` at tf) and critics (trained at tb, frozen
    at tf): each share averaged over the two orders (a Shapley split; the two shares add up to
    the primary's difference), and the interaction."""
    fixed = f"fixed_critic.{TAG[tf]}"
    rows = {"critic": {}, "actor": {}, "interaction": {}, "primary": {}}
    for s in SEEDS:
        bb = score(runs, evals, "test", "binac", "trained", tb, s)
        ff = score(runs, evals, "test", fixed, "frozen", tf, s)
        bf = score(runs, evals, "test", "binac", "frozen", tf, s)  # trained actor, frozen critic
        fb = score(runs, evals, "test", fixed, "trained", tb, s)  # frozen-run actor, trained critic
        rows["primary"][s] = None if None in (bb, ff) else bb - ff
        if None in (bb, ff, bf, fb):
            rows["critic"][s] = rows["actor"][s] = rows["interaction"][s] = None
            continue
        rows["critic"][s] = ((fb - ff) + (bb - bf)) / 2
        rows["actor"][s] = ((bf - ff) + (bb - fb)) / 2
        rows["interaction"][s] = bb - bf - fb + ff
    return {k: test_row(v) for k, v in rows.items()}


def fmt(row: dict) -> str:
    per = ", ".join(f"s{s}: {'-' if v is None else f'{v:+.3f}'}" for s, v in row["per_seed"].items())
    se = "-" if row["seeds"] < 2 else f"{row['se']:.3f}"
    t = "-" if math.isnan(row["t"]) else f"{row['t']:.2f}"
    return f"{row['seeds']} | {row['mean']:+.3f} | {se} | {t} | {per} | {row['shown']} |"


def controls(root: Path) -> None:
    runs, evals = load_runs(root), load_evals(root)
    tf, tb = choices(runs, evals)
    print("Calibration split (system score, mean over seeds 0-2; the chosen temperature in bold):\n\n"
          "| critic | " + " | ".join(TAG[t] for t in TEMPS) + " |\n" + "| --- " * (len(TEMPS) + 1) + "|")
    for name, actor, critic, chosen in (("frozen (its own fixed_critic run)", None, "frozen", tf),
                                        ("trained (binac)", "binac", "trained", tb)):
        cells = []
        for t in TEMPS:
            vs = [score(runs, evals, "calibration", actor or f"fixed_critic.{TAG[t]}", critic, t, s) for s in SEEDS]
            got = [v for v in vs if v is not None]
            cell = f"{mean_se(got)[0]:.3f} ({len(got)} seeds)" if got else "-"
            cells.append(f"**{cell}**" if t == chosen else cell)
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\n| test | difference | seeds | mean | SE | t | per seed | shown |\n" + "| --- " * 8 + "|")
    if tf is None or tb is None:
        print("| primary | not decided: the calibration evaluations are incomplete | | | | | | |")
    else:
        gain = split_gain(runs, evals, tf, tb)
        print(f"| primary | `binac` at {TAG[tb]} − `fixed_critic` at {TAG[tf]} (system) | {fmt(gain['primary'])}")
        print(f"| secondary | the critic's share | {fmt(gain['critic'])}")
        print(f"| secondary | the actor's share | {fmt(gain['actor'])}")
        print(f"| secondary | interaction (not a share) | {fmt(gain['interaction'])}")
    for t in TEMPS:
        d = {s: None if None in (a := score(runs, evals, "test", "binac", "trained", t, s),
                                 b := score(runs, evals, "test", f"fixed_critic.{TAG[t]}", "frozen", t, s))
             else a - b for s in SEEDS}
        print(f"| secondary (sharpening) | `binac` − `fixed_critic`, both at {TAG[t]} | {fmt(test_row(d))}")
    lag = {s: None if None in (a := run_system(runs.get(("binac.ref12", s))), b := run_system(runs.get(("binac", s))))
           else a - b for s in SEEDS}
    print(f"| lag arm | `binac` reference_every 12 − 4 (system, t1) | {fmt(test_row(lag))}")
    stopped = sorted(f"{p}_s{s}" for (p, s), r in runs.items() if r.get("stopped"))
    if stopped:
        print("\nStopped by a guard (counted at their last evaluation, or 0): " + ", ".join(stopped))


def discovery(root: Path) -> None:
    runs = load_runs(root)
    d = {s: None if None in (a := run_system(runs.get(("binac", s))), b := run_system(runs.get(("fixed_critic", s))))
         else a - b for s in SEEDS}
    row = test_row(d)
    print("| test | difference | seeds | mean | SE | t | per seed | shown |\n" + "| --- " * 8 + "|")
    print(f"| primary | `binac` − `fixed_critic` (system) | {fmt(row)}")
    found = sum(v is not None and v >= SHOWN[0] for v in d.values())
    print(f"\nSeeds where the trained critic's system beat the frozen one's by >= +0.10: {found} of {len(SEEDS)}")
    print("\n| seed | frozen critic, calibration fix rate | trained critic, calibration fix rate | states the rule "
          "(trained) | fix rate in training, 1st / 2nd half |\n" + "| --- " * 5 + "|")
    room = next(iter(sorted(Path(root).glob("room_*_*.json"))), None)
    frozen = json.loads(room.read_text())["frozen_critic_fix_rate"] if room else None
    for s in SEEDS:
        f = Path(root, f"room_trained_s{s}.json")
        got = json.loads(f.read_text()) if f.is_file() else {}
        halves = (runs.get(("binac", s)) or {}).get("critic_fix_rate_halves") or [None, None]
        num = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        print(f"| s{s} | {num(frozen)} | {num(got.get('frozen_critic_fix_rate'))} | {num(got.get('states_rule_rate'))} "
              f"| {num(halves[0])} / {num(halves[1])} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--choice", action="store_true", help="print the two chosen temperatures and exit")
    ap.add_argument("--discovery", action="store_true")
    args = ap.parse_args(argv)
    root = Path(args.root)
    if args.choice:
        tf, tb = choices(load_runs(root), load_evals(root))
        if tf is None or tb is None:
            print("the calibration evaluations are incomplete: no temperature is chosen", file=sys.stderr)
            return 3
        print(tf, tb)
        return 0
    discovery(root) if args.discovery else controls(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
