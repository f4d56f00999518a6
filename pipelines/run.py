"""Entry point: `python pipelines/run.py --config pipelines/configs/<name>.yaml [key=value ...]`.

Runs on a Ray started in-process unless RAY_ADDRESS names a cluster (as under `ray job submit`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a checkout without `pip install`

from rltf_ray.config import PRESET_DIR, ConfigError, load_config  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run an RLTF pipeline on Ray.")
    ap.add_argument("--config", help="YAML config (pipelines/configs/*.yaml)")
    ap.add_argument("--preset", help="objective preset (see --list-presets)")
    ap.add_argument("--output-dir", help="where metrics, rollouts and checkpoints go")
    ap.add_argument("--resume", metavar="OUTPUT_DIR",
                    help="continue the run in OUTPUT_DIR from its last checkpoint (its saved config.yaml "
                         "is used unless --config is given)")
    ap.add_argument("--dry-run", action="store_true", help="print the resolved config and graph, start nothing")
    ap.add_argument("--graph", metavar="FILE", help="draw the pipeline graph (.svg .png .dot .mmd)")
    ap.add_argument("--list-presets", action="store_true")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.lr=1e-5")
    args = ap.parse_args(argv)
    if args.list_presets:
        import yaml

        for f in sorted(PRESET_DIR.glob("*.yaml")):
            desc = (yaml.safe_load(f.read_text()) or {}).get("description", "")
            print(f"{f.stem:16s} {desc}")
        return 0
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"run.output_dir={args.output_dir}")
    if args.resume:
        saved = Path(args.resume) / "config.yaml"
        if args.config is None and not saved.is_file():
            print(f"config error: --resume {args.resume}: no config.yaml there (not a run's output dir?)",
                  file=sys.stderr)
            return 2
        args.config = args.config or str(saved)
        overrides += [f"run.output_dir={args.resume}", "run.resume=must"]
    try:
        cfg = load_config(args.config, overrides, preset=args.preset)
        if args.graph:
            from rltf_ray.graph import draw

            draw(cfg, args.graph)
            print(f"graph written to {args.graph}")
        if args.dry_run:
            import yaml

            from rltf_ray.graph import describe

            print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            print("pipeline graph (execution order):")
            print(describe(cfg))
            return 0
        if args.graph:
            return 0
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from rltf_ray.runner import run

    try:
        summary = run(cfg)
    except ConfigError as e:  # found before anything started (e.g. bad rows in a prompt file)
        print(f"config error: {e}", file=sys.stderr)
        return 2
    b, a = summary.get("before"), summary.get("after")
    if b and a:
        from rltf_ray.metrics import eval_line

        print(f"\nheld-out, before: {eval_line(b)}\nheld-out, after:  {eval_line(a)}")
    print(f"outputs: {summary['output_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
