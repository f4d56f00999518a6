"""The critic as a standalone Serve application.

    serve run --route-prefix /rltf_critic serve.critic_app:app       # programmatic arithmetic critic
    serve run --route-prefix /rltf_critic serve.critic_app:app_builder task=math critic=llm_judge
    serve deploy serve/critic.yaml                                  # on a running cluster

Builder args: task (a task name), extraction, critic (programmatic | correctness_only |
llm_judge | openai, or a plugin's critic) and, for llm_judge, judge_model; for openai,
base_url, model, api_key_env; for both, judge_prompts (a mapping or a YAML/JSON file);
for a plugin's critic, critic_params (a mapping). plugins: the modules (import names or .py
paths, a list or a comma-separated string) that register the plugin's tasks and critics,
imported here and in the replicas.

HTTP: POST http://127.0.0.1:8000/rltf_critic  {"response": "...", "meta": {...}, "prompt": "..."}
  -> {"reward": float, "correct": bool, "format_ok": bool, "critique": str}
A pipeline attaches to it with `pipeline.critic.attach=true`.
"""
from rltf_ray.config import TaskConfig
from rltf_ray.graph import CritiqueParams
from rltf_ray.plugins import load_plugins
from rltf_ray.stages.critique import build_critic_app

CRITIC_ARGS = ("critic", "judge_model", "base_url", "model", "api_key_env", "judge_prompts",
               "critic_params")


def app_builder(args: dict):
    unknown = set(args) - {"task", "extraction", "plugins", *CRITIC_ARGS}
    if unknown:
        raise ValueError(f"critic app: unknown argument(s) {sorted(unknown)} "
                         f"(known: task, extraction, plugins, {', '.join(CRITIC_ARGS)})")
    plugins = args.get("plugins", [])
    if isinstance(plugins, str):  # `serve run ... plugins=a.py,b.py` passes a string
        plugins = [s for s in plugins.split(",") if s]
    load_plugins(plugins)  # before the task and the critic are resolved by name
    task = TaskConfig(name=args.get("task", "arithmetic"), extraction=args.get("extraction", "tag"))
    return build_critic_app(task, CritiqueParams(**{k: args[k] for k in CRITIC_ARGS if k in args}),
                            plugins=plugins)


app = app_builder({})
