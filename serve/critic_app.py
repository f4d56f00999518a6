"""The critic as a standalone Serve application.

    serve run serve.critic_app:app                      # programmatic arithmetic critic
    serve run serve.critic_app:app task=arithmetic      # args become TaskConfig fields

HTTP: POST http://127.0.0.1:8000/rltf_critic  {"response": "...", "meta": {...}}
  -> {"reward": float, "correct": bool, "format_ok": bool, "critique": str}
A pipeline attaches to it with `pipeline.critic.attach=true`.
"""
from rltf_ray.config import TaskConfig
from rltf_ray.graph import CritiqueParams
from rltf_ray.stages.critique import build_critic_app


def app_builder(args: dict):
    task = TaskConfig(name=args.get("task", "arithmetic"),
                      extraction=args.get("extraction", "tag"))
    return build_critic_app(task, CritiqueParams(critic=args.get("critic", "programmatic")))


app = app_builder({})
