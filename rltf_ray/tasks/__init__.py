"""Tasks: prompts with ground truth, answer extraction, scoring and programmatic critiques."""
from rltf_ray.tasks.base import Score, Task, get_task, register_task, task_has_verifier, task_names
from rltf_ray.tasks import arithmetic, math, puzzles, writing  # noqa: F401  (registers the built-in tasks)

__all__ = ["Score", "Task", "get_task", "register_task", "task_has_verifier", "task_names"]
