"""The sampler-trainer mismatch of every committed experiment, from its runs' metrics.jsonl
(docs/results.md, "Trainer-sampler agreement").

    .venv/bin/python docs/scripts/mismatch_table.py [results/NAME ...]

Per experiment: runs, the range over runs of each run's median `logprob_abs_diff_mean`, the
largest `logprob_abs_diff_max`, the range of per-run median `sampler_kl_k3` (named
`sampler_trainer_kl` before it had that name) and of per-run median and largest
`ratio_outside_clip_fraction`, and the engine dtype where the runs recorded it."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_stats(folder: Path) -> dict | None:
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
    diff = [r["logprob_abs_diff_mean"] for r in rows if r.get("logprob_abs_diff_mean") is not None]
    if not diff:
        return None
    kl = [r.get("sampler_kl_k3", r.get("sampler_trainer_kl")) for r in rows]
    clip = [r["ratio_outside_clip_fraction"] for r in rows if r.get("ratio_outside_clip_fraction") is not None]
    summary = folder / "summary.json"
    prov = json.loads(summary.read_text()).get("provenance") or {} if summary.is_file() else {}
    return {"diff": statistics.median(diff), "max": max(r.get("logprob_abs_diff_max") or 0 for r in rows),
            "kl": statistics.median([k for k in kl if k is not None]),
            "clip": statistics.median(clip) if clip else None, "clip_max": max(clip) if clip else None,
            "dtype": prov.get("engine_dtype", "not recorded")}


def span(xs: list[float], fmt: str) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return format(lo, fmt) if lo == hi else f"{format(lo, fmt)}–{format(hi, fmt)}"


def main(argv: list[str]) -> int:
    roots = [Path(a) for a in argv] or sorted(p for p in (ROOT / "results").iterdir() if (p / "runs").is_dir())
    print("| experiment | runs | median abs log-prob diff per run | largest | median sampler_kl_k3 per run "
          "| tokens outside the clip range, median per run | largest | engine dtype |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for root in roots:
        stats = [s for d in sorted((root / "runs").iterdir()) if (d / "metrics.jsonl").is_file()
                 for s in [run_stats(d)] if s]
        if not stats:
            continue
        print(f"| {root.name} | {len(stats)} | {span([s['diff'] for s in stats], '.3f')} | "
              f"{max(s['max'] for s in stats):.2f} | {span([s['kl'] for s in stats], '.2e')} | "
              f"{span([s['clip'] for s in stats], '.3f')} | {span([s['clip_max'] for s in stats], '.3f')} | "
              f"{', '.join(sorted({s['dtype'] for s in stats}))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
