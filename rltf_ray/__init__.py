"""rltf_ray: reinforcement learning from text feedback on Ray (see README.md).

The public names: `Task`, `Score` and `register_task` for a task of your own;
`register_critic` for a critic of your own; `RLTFConfig` (builder) -> `build()` -> `RLTF`
(`train()`, `evaluate()`, `save()`, `restore()`, `stop()`); `tune_trainable` for Ray Tune;
`preset_names`."""
from __future__ import annotations

__version__ = "0.1.0"

_PUBLIC = {
    "Task": "rltf_ray.tasks.base",
    "Score": "rltf_ray.tasks.base",
    "register_task": "rltf_ray.tasks.base",
    "register_critic": "rltf_ray.critics",
    "RLTFConfig": "rltf_ray.api",
    "RLTF": "rltf_ray.api",
    "tune_trainable": "rltf_ray.tuning",
    "preset_names": "rltf_ray.loading",
    "ConfigError": "rltf_ray.errors",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    # imported on first use: `import rltf_ray` stays cheap, and Ray workers that only
    # unpickle a task do not import the trainer's dependencies
    if name in _PUBLIC:
        import importlib

        if name in ("Task", "Score", "register_task"):
            importlib.import_module("rltf_ray.tasks")  # the built-in tasks register themselves
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'rltf_ray' has no attribute {name!r}")
