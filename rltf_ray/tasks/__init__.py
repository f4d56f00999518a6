"""Tasks: prompts with ground truth, answer extraction, scoring and programmatic critiques."""
from rltf_ray.tasks.base import (FileTask, Score, Task, register_task, registered_task, task_class,
                                 task_has_verifier, task_names)
from rltf_ray.tasks import arithmetic, convention, math, rewards, writing  # noqa: F401  (registers the built-in tasks)
from rltf_ray.tasks.puzzles import rg_task

__all__ = ["FileTask", "Score", "Task", "get_task", "register_task", "task_class", "task_has_verifier", "task_names"]


def get_task(cfg) -> Task:
    """The task a TaskConfig names: a registered one (built in, or a plugin's), or any
    reasoning-gym dataset as `rg:<name>`."""
    return rg_task(cfg) if cfg.name.startswith("rg:") else registered_task(cfg)
