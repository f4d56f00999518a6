"""The command line: `rltf-ray` (installed) and `python pipelines/run.py` (a checkout).

    rltf-ray --config pipelines/configs/tiny.yaml [--preset rltf_sd] [--plugin my_task.py] [key=value ...]
    rltf-ray --list-presets
    rltf-ray eval --config ... [--model CHECKPOINT] [--feedback-rounds 1] ...
    rltf-ray eval --config ... --preset fixed_critic --model ACTOR --critic CRITIC --critic-temperature 0 \\
        --feedback-rounds 1 [--split calibration]   # one actor with one critic, as a system
    rltf-ray check --config ... [--problems 64]   # p0 and p1: can this model use these critiques?
    rltf-ray warmstart --config ... --out DIR      # a short supervised warm start before RL
    rltf-ray compare --config ... --presets a,b --seeds 3 --name NAME   # presets at equal samples
    rltf-ray report results/NAME                    # a comparison's tables, from its run folders
    rltf-ray plot OUTPUT_DIR                        # a run's learning curves
    rltf-ray example [NAME DIR]                     # copy a worked example out of the package

Runs on a Ray started in-process unless RAY_ADDRESS names a cluster (as under `ray job submit`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rltf_ray.errors import DEAD_CRITIC_EXIT, STOPPED_FILE, ConfigError, DeadCriticError, cause_line


def _common(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE",
                    help="a module (import name or .py path) that registers your tasks or critics; repeatable")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, e.g. trainer.lr=1e-5")


def run_main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="rltf-ray", description="Run an RLTF pipeline on Ray.",
        epilog="other commands: rltf-ray {eval,check,warmstart,compare,report,plot,example} --help",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="a YAML config, or a shipped one by name (demo, tiny, expansion, gpu, ...)")
    ap.add_argument("--preset", help="objective preset (see --list-presets) or a preset YAML path")
    ap.add_argument("--output-dir", help="where metrics, rollouts and checkpoints go")
    ap.add_argument("--resume", metavar="OUTPUT_DIR",
                    help="continue the run in OUTPUT_DIR from its last checkpoint (its saved config.yaml "
                         "is used unless --config is given)")
    ap.add_argument("--dry-run", action="store_true", help="print the resolved config and graph, start nothing")
    ap.add_argument("--graph", metavar="FILE", help="draw the pipeline graph (.svg .png .dot .mmd)")
    ap.add_argument("--list-presets", action="store_true")
    _common(ap)
    args = ap.parse_args(argv)
    from rltf_ray.loading import load_config, preset_description, preset_names

    if args.list_presets:
        for name in preset_names():
            print(f"{name:16s} {preset_description(name)}")
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
        cfg = load_config(args.config, overrides, preset=args.preset, plugins=args.plugin)
        if args.graph or args.dry_run:
            return _describe(cfg, args.graph, args.dry_run)
        from rltf_ray.runner import run

        Path(cfg.run.output_dir, STOPPED_FILE).unlink(missing_ok=True)  # an earlier attempt's, if any
        summary = run(cfg)
    except ConfigError as e:  # before anything started (e.g. bad rows in a prompt file)
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except DeadCriticError as e:
        # a guard, not a crash: recorded beside the run's metrics, so that a comparison reports
        # the run as stopped by it rather than losing it or keeping it as a finished run
        Path(cfg.run.output_dir).mkdir(parents=True, exist_ok=True)
        Path(cfg.run.output_dir, STOPPED_FILE).write_text(json.dumps({"stopped_by": "dead_critic", "error": str(e)}))
        print(f"stopped: {e}", file=sys.stderr)
        return DEAD_CRITIC_EXIT
    except Exception as e:  # noqa: BLE001 - the traceback first, then the line that names the cause
        import traceback

        traceback.print_exc()
        print(f"\nrun failed: {cause_line(e)}", file=sys.stderr)
        return 1
    b, a = summary.get("before"), summary.get("after")
    if b and a:
        from rltf_ray.metrics import eval_line

        print(f"\nheld-out, before: {eval_line(b)}\nheld-out, after:  {eval_line(a)}")
    print(f"outputs: {summary['output_dir']}")
    return 0


def _describe(cfg, graph: str | None, dry_run: bool) -> int:
    import yaml

    from rltf_ray.graph import describe, draw

    if graph:
        draw(cfg, graph)
        print(f"graph written to {graph}")
    if dry_run:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        print("pipeline graph (execution order):")
        print(describe(cfg))
    return 0


def eval_main(argv=None) -> int:
    """Held-out evaluation of a model or checkpoint (rltf_ray/evaluation.py): greedy accuracy,
    sampled pass@k, accuracy after rounds with the critic in the loop, and after rounds of
    self-feedback, each with its standard error over distinct held-out problems."""
    ap = argparse.ArgumentParser(prog="rltf-ray eval", description=eval_main.__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--preset", help="objective preset whose critic evaluates (fixed_critic: a learned critic)")
    ap.add_argument("--model", help="an HF folder or checkpoint (default: the config's model.path)")
    ap.add_argument("--critic", help="the learned critic's HF folder or checkpoint (binac.critic_model), "
                                     "e.g. a run's checkpoints/step_N/critic")
    ap.add_argument("--critic-temperature", type=float,
                    help="the learned critic's temperature for its critiques (0 = greedy; eval.critic_temperature)")
    ap.add_argument("--split", choices=("test", "calibration"),
                    help="score the held-out problems (test, the default) or the calibration ones (eval.split)")
    ap.add_argument("--prompts", type=int, help="distinct held-out problems")
    ap.add_argument("--held-out", help="a held-out prompt file of your own (default: the task's test split)")
    ap.add_argument("--pass-k", help="comma-separated k for sampled pass@k, e.g. 1,4,8")
    ap.add_argument("--samples", type=int, help="samples per problem for pass@k")
    ap.add_argument("--feedback-rounds", type=int)
    ap.add_argument("--self-feedback-rounds", type=int)
    ap.add_argument("--output", help="write the results as JSON here")
    _common(ap)
    args = ap.parse_args(argv)
    overrides = list(args.overrides)
    for flag, key in (("model", "model.path"), ("prompts", "eval.prompts"), ("samples", "eval.samples"),
                      ("held_out", "eval.path"), ("feedback_rounds", "eval.feedback_rounds"),
                      ("self_feedback_rounds", "eval.self_feedback_rounds"), ("critic", "binac.critic_model"),
                      ("critic_temperature", "eval.critic_temperature"), ("split", "eval.split")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    if args.pass_k:
        overrides.append(f"eval.pass_k=[{args.pass_k}]")
    from rltf_ray.loading import load_config

    try:
        cfg = load_config(args.config, overrides, preset=args.preset, plugins=args.plugin)
        from rltf_ray.metrics import eval_line
        from rltf_ray.runner import evaluate_only

        pipe, result = evaluate_only(cfg)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    result.update(model=pipe.model_path, task=cfg.task.name)
    if pipe.critic_model:  # which critic, at which temperature: a pair of checkpoints is scored as one system
        from rltf_ray.models import weights_sha256

        result.update(critic=pipe.critic_model, critic_temperature=(
            cfg.binac.temperature if cfg.eval.critic_temperature is None else cfg.eval.critic_temperature),
            weights_sha256={"actor": weights_sha256(pipe.model_path), "critic": weights_sha256(pipe.critic_model)})
    print(eval_line(result))
    for k, v in result.items():
        if isinstance(v, float):
            print(f"  {k:32s} {v:.4f}")
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "eval":
        return eval_main(argv[1:])
    if argv and argv[0] == "check":
        from rltf_ray.check import check_main

        return check_main(argv[1:])
    commands = {"warmstart": ("rltf_ray.commands.warmstart", "main"),
                "compare": ("rltf_ray.commands.compare", "main"),
                "report": ("rltf_ray.commands.report", "report_main"),
                "plot": ("rltf_ray.commands.report", "plot_main"),
                "example": ("rltf_ray.commands.example", "example_main")}
    if argv and argv[0] in commands:
        import importlib

        module, func = commands[argv[0]]
        return getattr(importlib.import_module(module), func)(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
