"""The critic as a standalone Serve application.

    serve run serve.critic_app:app                                  # programmatic arithmetic critic
    serve run serve.critic_app:app_builder task=math critic=llm_judge   # args: see below
    serve deploy serve/critic.yaml                                  # on a running cluster

Builder args: task (a task name), extraction, critic (programmatic | correctness_only |
llm_judge | openai) and, for llm_judge, judge_model; for openai, base_url, model, api_key_env.

HTTP: POST http://127.0.0.1:8000/rltf_critic  {"response": "...", "meta": {...}, "prompt": "..."}
  -> {"reward": float, "correct": bool, "format_ok": bool, "critique": str}
A pipeline attaches to it with `pipeline.critic.attach=true`.
"""
from rltf_ray.config import TaskConfig
from rltf_ray.graph import CritiqueParams
from rltf_ray.stages.critique import build_critic_app

CRITIC_ARGS = ("critic", "judge_model", "base_url", "model", "api_key_env")


def app_builder(args: dict):
    task = TaskConfig(name=args.get("task", "arithmetic"), extraction=args.get("extraction", "tag"))
    unknown = set(args) - {"task", "extraction", *CRITIC_ARGS}
    if unknown:
        raise ValueError(f"critic app: unknown argument(s) {sorted(unknown)} "
                         f"(known: task, extraction, {', '.join(CRITIC_ARGS)})")
    return build_critic_app(task, CritiqueParams(**{k: args[k] for k in CRITIC_ARGS if k in args}))


app = app_builder({})
