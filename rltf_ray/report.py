"""Reading finished runs back: one run's learning curve and totals, a comparison table over
presets and seeds (mean ± standard error), and the pictures. Used by rltf-ray compare
and rltf-ray plot."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from rltf_ray.evaluation import mean_se


def read_metrics(out: Path) -> list[dict]:
    path = Path(out) / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def collect_run(out: Path, preset: str, seed: int) -> dict:
    """One run's numbers: held-out evaluations before, during and after, and its costs."""
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    prov = summary.get("provenance") or {}
    steps = read_metrics(out)
    curve = []
    if summary.get("before"):
        curve.append({**summary["before"], "samples_seen": 0})
    for m in steps:
        if "eval" in m:
            curve.append({**m["eval"], "samples_seen": m["samples_seen"]})
    end = steps[-1]["samples_seen"] if steps else 0
    # the last in-run evaluation and the final one are the same point when they fall on the
    # last step: counted twice, it would shrink the curve's standard error
    if summary.get("after") and not (curve and curve[-1]["samples_seen"] == end and len(curve) > 1):
        curve.append({**summary["after"], "samples_seen": end})
    return {"preset": preset, "seed": seed, "output_dir": str(out), "steps": len(steps),
            "before": summary.get("before"), "after": summary.get("after"), "curve": curve,
            "samples_seen": steps[-1]["samples_seen"] if steps else 0,
            "generate_tokens": sum(m.get("generate_tokens", 0) for m in steps),
            "train_tokens": sum(m.get("rl_tokens_trained", 0) + m.get("sd_tokens_trained", 0) for m in steps),
            "seconds": sum(m.get("seconds_step", 0.0) for m in steps),
            "step_seconds": {k: mean_se([m.get(f"seconds_{k}", 0.0) for m in steps])[0]
                             for k in ("step", "rollout", "train", "sync")} if steps else {},
            "revision_gain": mean_se([m["revision_gain"] for m in steps if "revision_gain" in m])[0],
            "first_turn_accuracy_train": mean_se([m["first_turn_accuracy"] for m in steps])[0],
            "prompt_ids": [m.get("prompt_ids", []) for m in steps],
            "critic_fix_rate_halves": fix_rate_halves(steps),
            "weights_sha256": summary.get("weights_sha256"),
            "final_weights": summary.get("final_weights"),  # the run's last checkpoint and its hashes
            # the arm: a comparison's --variant suffix of the preset (`rltf_sd.fp32`), else "default"
            "variant": preset.partition(".")[2] or "default",
            **{k: prov.get(k) for k in ("commit", "engine_dtype", "learner_dtype", "head_dtype", "lr", "loss")}}


def fix_rate_halves(steps: list[dict]) -> list[float] | None:
    """A learned critic's fix rate (the share of revisions from its critiques of wrong first
    answers that are correct) over the first and the second half of the run's steps, each
    pooled over its revisions; None without a learned critic."""
    half = len(steps) // 2
    out = []
    for part in (steps[:half], steps[half:]):
        got = [(m["critic_fix_rate"], m.get("critic_fix_revisions", 1)) for m in part
               if m.get("critic_fix_rate") is not None]
        n = sum(c for _, c in got)
        out.append(sum(r * c for r, c in got) / n if n else math.nan)
    return None if all(math.isnan(x) for x in out) else out


def _cell(values: list[float]) -> str:
    """Mean ± SE; a single seed has no standard error, and the cell says so instead of ± 0."""
    m, se = mean_se(values)
    return f"{m:.3f} ± {se:.3f}" if len(values) > 1 else f"{m:.3f} (1 seed)"


def write_table(runs: list[dict], path: Path, title: str = "") -> str:
    """Per preset, over seeds: final held-out greedy first-turn accuracy (mean ± SE), its
    change from before training, the training revision gain, optional pass@k and feedback
    accuracy, and the cost in generated tokens and wall time."""
    by: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by[r["preset"]].append(r)
    extra = sorted({k for r in runs for k in (r["after"] or {})
                    if (k.startswith("pass@") or k.startswith("feedback_accuracy_")
                        or k.startswith("self_feedback_accuracy_")) and not k.endswith("_se")})
    fix = any(r.get("critic_fix_rate_halves") for r in runs)
    head = ["preset", "seeds", "held-out acc after (greedy)", "before", "change", "revision gain (train)",
            *extra, *(["critic fix rate, 1st half", "2nd half", "2nd - 1st"] if fix else []),
            "gen tokens / run", "minutes / run"]
    lines = [f"# {title}" if title else "", "", "| " + " | ".join(head) + " |",
             "|" + " --- |" * len(head)]
    for preset, rs in by.items():
        after = [r["after"]["greedy_accuracy"] for r in rs if r["after"]]
        before = [r["before"]["greedy_accuracy"] for r in rs if r["before"]]
        change = [a - b for a, b in zip(after, before)]
        cells = [preset, str(len(rs)), _cell(after), _cell(before), _cell(change),
                 f"{mean_se([r['revision_gain'] for r in rs])[0]:+.3f}"]
        cells += [_cell([r["after"][k] for r in rs if r["after"] and k in r["after"]]) for k in extra]
        if fix:
            halves = [h for r in rs if (h := r.get("critic_fix_rate_halves")) and not any(map(math.isnan, h))]
            cells += [_cell([h[0] for h in halves]), _cell([h[1] for h in halves]),
                      _cell([h[1] - h[0] for h in halves])] if halves else ["-"] * 3
        cells += [f"{mean_se([r['generate_tokens'] for r in rs])[0]:.0f}",
                  f"{mean_se([r['seconds'] for r in rs])[0] / 60:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    n = max((r["after"] or {}).get("problems", 0) for r in runs) if runs else 0
    lines += ["", f"Mean ± standard error over seeds; each accuracy is on {n} distinct held-out problems. "
              "'change' is after minus before within each seed. Finished runs only: a run that a guard "
              "stopped is listed in runs.md and counted against its preset in paired.md."]
    text = "\n".join(lines) + "\n"
    Path(path).write_text(text)
    return text


def arm_baseline(preset: str, baseline: str, runs: list[dict]) -> str:
    """The baseline an arm is paired with: the baseline of its own variant (`rltf_sd.fp32`
    against `grpo_single.fp32`) where that variant has baseline runs, else `baseline`."""
    variant = preset.partition(".")[2]
    own = f"{baseline}.{variant}"
    return own if variant and any(r["preset"] == own for r in runs) else baseline


def stopped_endpoint(run: dict, key: str = "greedy_accuracy") -> float:
    """A run that a guard stopped, counted against its method: `key` at its last held-out
    evaluation that measured it, or 0 where none did (a stopped run is never left out)."""
    for e in reversed(run.get("evaluations") or []):
        if e.get(key) is not None:
            return float(e[key])
    return 0.0


def paired(runs: list[dict], baseline: str, key: str = "greedy_accuracy",
           stopped: list[dict] = ()) -> list[dict]:
    """Each preset against `baseline`, paired by seed (same prompts, same held-out problems):
    the per-seed differences of the final held-out `key`, their mean, SE and t = mean / SE.
    A run a guard stopped (`stopped`, from `stopped_run`) takes part at `stopped_endpoint`:
    its seeds are listed in `stopped_seeds` (the preset's runs) and `baseline_stopped_seeds`
    (the baseline's, which `write_paired` never lets a verdict rest on)."""
    final = {(r["preset"], r["seed"]): r["after"][key] for r in runs if r.get("after") and key in r["after"]}
    halted = {(r["preset"], r["seed"]) for r in stopped}
    for r in stopped:
        final.setdefault((r["preset"], r["seed"]), stopped_endpoint(r, key))
    everyone = [*runs, *stopped]
    out = []
    for preset in dict.fromkeys(r["preset"] for r in everyone):
        against = arm_baseline(preset, baseline, everyone)
        if preset == against:
            continue
        base = {s: v for (p, s), v in final.items() if p == against}
        seeds = sorted(s for (p, s) in final if p == preset and s in base)
        diffs = [final[(preset, s)] - base[s] for s in seeds]
        m, se = mean_se(diffs)
        if len(diffs) < 2:  # one seed has no standard error, and so no t
            se = t = math.nan
        else:
            t = m / se if se > 0 else (math.inf if m > 0 else -math.inf if m < 0 else 0.0)
        out.append({"preset": preset, "baseline": against, "seeds": seeds, "diffs": diffs, "mean": m,
                    "se": se, "t": t, "stopped_seeds": [s for s in seeds if (preset, s) in halted],
                    "baseline_stopped_seeds": [s for s in seeds if (against, s) in halted]})
    return out


def verdict(r: dict, shown: tuple[float, float] = (0.10, 3.0)) -> str:
    """A paired row's verdict: "yes" when it reaches `shown` = (effect, t) on at least 2 seeds
    with no stopped baseline run among them; otherwise "no", saying when stopped runs decided it.
    A stopped run of the preset is already counted against it (`stopped_endpoint`); a stopped
    run of the baseline would count for the preset, so it leaves the test undecided."""
    if r.get("baseline_stopped_seeds"):
        k = len(r["baseline_stopped_seeds"])
        return f"no (not decided: {k} of {len(r['seeds'])} baseline runs stopped by a guard)"
    ok = len(r["seeds"]) > 1 and r["mean"] >= shown[0] and r["t"] >= shown[1]
    if r.get("stopped_seeds"):
        return f"{'yes' if ok else 'no'} ({len(r['stopped_seeds'])} of {len(r['seeds'])} runs stopped by a guard, counted)"
    return "yes" if ok else "no"


def write_paired(runs: list[dict], baseline: str, path: Path, shown: tuple[float, float] = (0.10, 3.0),
                 stopped: list[dict] = ()) -> str:
    """The paired comparison as a table; `shown` = (effect, t) a difference must reach;
    `stopped`: the runs a guard stopped (`stopped_run`), counted as `paired` counts them."""
    rows = paired(runs, baseline, stopped=stopped)
    lines = [f"Held-out greedy first-try accuracy after training, each preset minus {baseline} (of its own "
             f"variant where one ran), paired by seed. Shown: mean >= +{shown[0]:.2f} at t >= {shown[1]:.0f}. "
             "A run that a guard stopped counts against its preset, never as absent: its accuracy at its last "
             "held-out evaluation, or 0 without one (marked 'stopped'); a stopped baseline run leaves the test "
             "not decided.", "",
             "| preset | against | seeds | mean difference | SE | t | per seed | shown |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        mark = {s: " (stopped)" for s in r["stopped_seeds"]} | {s: " (baseline stopped)"
                                                                for s in r["baseline_stopped_seeds"]}
        per = ", ".join(f"s{s}: {d:+.3f}{mark.get(s, '')}" for s, d in zip(r["seeds"], r["diffs"]))
        se, t = ("-", "-") if math.isnan(r["se"]) else (f"{r['se']:.3f}", f"{r['t']:.2f}")
        lines.append(f"| {r['preset']} | {r['baseline']} | {len(r['seeds'])} | {r['mean']:+.3f} | {se} | {t} | "
                     f"{per} | {verdict(r, shown)} |")
    curve = paired_curve(runs, baseline)
    if curve:
        lines += ["", f"Along the way (the held-out evaluations during training; not the test above): each "
                  f"preset minus {baseline}, paired by seed, mean (SE) at each count of first-turn samples.", ""]
        xs = sorted({c["samples_seen"] for c in curve})
        lines += ["| preset | " + " | ".join(str(x) for x in xs) + " |", "|" + " --- |" * (len(xs) + 1)]
        for preset in dict.fromkeys(c["preset"] for c in curve):
            at = {c["samples_seen"]: c for c in curve if c["preset"] == preset}
            lines.append(f"| {preset} | " + " | ".join(
                "-" if x not in at else f"{at[x]['mean']:+.3f}" + (
                    "" if math.isnan(at[x]["se"]) else f" ({at[x]['se']:.3f})") for x in xs) + " |")
    text = "\n".join(lines) + "\n"
    Path(path).write_text(text)
    return text


def write_runs(runs: list[dict], path: Path, stopped: list[str] = ()) -> str:
    """One row per run: its held-out greedy first try before training, at every evaluation
    on the way and after (with the after-critique accuracy p1 where it was measured), its
    wall time and where a step's time went; then the runs a guard stopped (`stopped`)."""
    # the points between the before- and the after-evaluation, which have columns of their own
    points = sorted({p["samples_seen"] for r in runs for p in r["curve"][1:-1]})
    head = ["run", "before (p0 / p1)", *[f"{x} samples" for x in points], "after (p1)", "minutes in steps",
            "s / step (rollout, learner, sync)", "weights (SHA-256)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in runs:
        at = {p["samples_seen"]: p["greedy_accuracy"] for p in r["curve"] if "greedy_accuracy" in p}
        b, a, t = r["before"] or {}, r["after"] or {}, r.get("step_seconds") or {}

        def acc(e):
            p1 = e.get("feedback_accuracy_1")
            return f"{e['greedy_accuracy']:.3f}" + (f" ({p1:.3f})" if p1 is not None else "") if e else "-"

        cells = [f"{r['preset']} s{r['seed']}",
                 f"{b['greedy_accuracy']:.3f} / {b['feedback_accuracy_1']:.3f}" if "feedback_accuracy_1" in b
                 else acc(b), *[f"{at[x]:.3f}" if x in at else "-" for x in points], acc(a),
                 f"{r['seconds'] / 60:.1f}",
                 f"{t['step']:.1f} ({t['rollout']:.1f}, {t['train']:.1f}, {t['sync']:.1f})" if t else "-",
                 weights_cell(r.get("weights_sha256"))]
        lines.append("| " + " | ".join(cells) + " |")
    if stopped:
        lines += ["", "Stopped by a guard (not in the table above; paired.md counts each against its preset):",
                  *stopped]
    text = "\n".join(lines) + "\n"
    Path(path).write_text(text)
    return text


def weights_cell(weights: dict | None) -> str:
    """The first 8 hex digits of each starting model's weights (actor, then critic), so that runs
    of one comparison can be checked to start from the same ones."""
    if not weights:
        return "not recorded"
    return " / ".join(f"{role} " + ",".join(h[:8] for h in files.values()) if files else f"{role} (not a local folder)"
                      for role, files in weights.items())


def paired_curve(runs: list[dict], baseline: str, key: str = "greedy_accuracy") -> list[dict]:
    """The paired difference against `baseline` at every evaluation point both runs of a seed
    share (first-turn samples seen): the curve's counterpart of `paired`."""
    at = {(r["preset"], r["seed"]): {p["samples_seen"]: p[key] for p in r["curve"] if key in p} for r in runs}
    out = []
    for preset in dict.fromkeys(r["preset"] for r in runs):
        against = arm_baseline(preset, baseline, runs)
        if preset == against:
            continue
        seeds = sorted(s for (p, s) in at if p == preset and (against, s) in at)
        for x in sorted({x for s in seeds for x in at[(preset, s)]}):
            diffs = [at[(preset, s)][x] - at[(against, s)][x] for s in seeds
                     if x in at[(preset, s)] and x in at[(against, s)]]
            if diffs:
                m, se = mean_se(diffs)
                out.append({"preset": preset, "samples_seen": x, "seeds": len(diffs), "mean": m,
                            "se": se if len(diffs) > 1 else math.nan})
    return out


def finished_runs(root: Path) -> list[dict]:
    """Every finished run under `root`/runs/<preset>_s<seed>/ (its summary.json exists)."""
    runs = []
    for d in sorted(Path(root, "runs").glob("*_s*")):
        if d.is_dir() and (d / "summary.json").is_file():
            preset, _, seed = d.name.rpartition("_s")
            runs.append(collect_run(d, preset, int(seed)))
    return sorted(runs, key=lambda r: (r["seed"], r["preset"]))


def stopped_run(out: Path, preset: str, seed: int) -> dict:
    """A run that a guard stopped (its STOPPED_FILE), as a record a verdict can count: the
    guard and its reason, the steps it trained and its held-out evaluations on the way
    (metrics.jsonl), the last of which `stopped_endpoint` reads."""
    from rltf_ray.errors import STOPPED_FILE

    out = Path(out)
    got = json.loads((out / STOPPED_FILE).read_text())
    steps = read_metrics(out)
    return {"preset": preset, "seed": seed, "output_dir": str(out), "stopped_by": got.get("stopped_by", "?"),
            "error": got.get("error", ""), "steps": len(steps),
            "evaluations": [{**m["eval"], "samples_seen": m.get("samples_seen", 0)} for m in steps if "eval" in m]}


def guard_stopped_runs(root: Path) -> list[dict]:
    """Every run under `root`/runs/ that a guard stopped, as `stopped_run` records."""
    from rltf_ray.errors import STOPPED_FILE

    out = []
    for d in sorted(Path(root, "runs").glob("*_s*")):
        if d.is_dir() and (d / STOPPED_FILE).is_file() and not (d / "summary.json").is_file():
            preset, _, seed = d.name.rpartition("_s")
            out.append(stopped_run(d, preset, int(seed)))
    return sorted(out, key=lambda r: (r["seed"], r["preset"]))


def stopped_runs(root: Path) -> list[str]:
    """One line per run that a guard stopped (its STOPPED_FILE): which run, and why."""
    return [f"- {r['preset']}_s{r['seed']}: stopped by the {r['stopped_by'].replace('_', '-')} guard: {r['error']}"
            for r in guard_stopped_runs(root)]


def write_report(root: Path, title: str = "", baseline: str | None = None) -> str:
    """runs.jsonl, table.md, runs.md, paired.md (against `baseline`) and curves.png, all from the run
    folders' own metrics.jsonl and summary.json."""
    root = Path(root)
    runs = finished_runs(root)
    with open(root / "runs.jsonl", "w") as f:
        for r in runs:
            f.write(json.dumps(r) + "\n")
    if not runs:
        return "no finished runs\n" + "".join(f"{line}\n" for line in stopped_runs(root))
    text = write_table(runs, root / "table.md", title=title)
    text += "\n" + write_runs(runs, root / "runs.md", stopped_runs(root))
    halted = guard_stopped_runs(root)
    if baseline and any(r["preset"].partition(".")[0] == baseline for r in [*runs, *halted]):
        text += "\n" + write_paired(runs, baseline, root / "paired.md", stopped=halted)
    write_curves(runs, root / "curves.png", title=title or root.name)
    return text


def write_curves(runs: list[dict], path: Path, title: str = "", key: str = "greedy_accuracy") -> None:
    """Held-out accuracy against first-turn samples seen: one line per preset, mean over seeds
    with a band of one standard error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by[r["preset"]].append(r)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for preset, rs in by.items():
        points: dict[int, list[float]] = defaultdict(list)
        for r in rs:
            for p in r["curve"]:
                if key in p:
                    points[p["samples_seen"]].append(p[key])
        xs = sorted(points)
        stats = [mean_se(points[x]) for x in xs]
        ys = [m for m, _ in stats]
        ax.plot(xs, ys, marker="o", label=f"{preset} ({len(rs)} seeds)")
        ax.fill_between(xs, [m - s for m, s in stats], [m + s for m, s in stats], alpha=0.2)
    ax.set_xlabel("first-turn samples seen")
    ax.set_ylabel(f"held-out {key.replace('_', ' ')}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_run_plots(out: Path, path: Path) -> list[str]:
    """A single run's learning curves (rewards, accuracies, losses, step time) on one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = read_metrics(out)
    if not steps:
        raise ValueError(f"{out}: no metrics.jsonl rows to plot")
    x = [m["step"] + 1 for m in steps]
    panels = [("rewards", ["reward_first_mean", "reward_second_mean"]),
              ("accuracy", ["first_turn_accuracy", "second_turn_accuracy"]),
              ("losses", [k for k in ("loss", "loss_rl0", "loss_rl1", "loss_sd", "loss_fm", "loss_sft")
                          if any(m.get(k) for m in steps)]),
              ("seconds", ["seconds_rollout", "seconds_train", "seconds_sync"])]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    drawn = []
    for ax, (name, keys) in zip(axes.flat, panels):
        for k in keys:
            ys = [m.get(k) for m in steps]
            if any(isinstance(y, (int, float)) and math.isfinite(y) for y in ys if y is not None):
                ax.plot(x, [y if y is not None else math.nan for y in ys], marker=".", label=k)
                drawn.append(k)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(str(out))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return drawn
