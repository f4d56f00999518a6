"""Critics: the registry, the contract every critic implements (see `base`), and the built-in
critics, registered by the same decorator a user plugin uses:

    from rltf_ray.critics import register_critic

    @register_critic("length")
    class LengthCritic:
        def __init__(self, task, target: int = 100):
            self.task, self.target = task, target

        def judge(self, items):
            return [{"reward": ..., "correct": ..., "critique": ...} for item in items]

A critic that scores with the task calls `score_items(self.task, items)`: one `score_batch`
for the items, with their token ids and step, so that reward functions get them as TRL passes
them (`task.score(text, meta)` has neither).

`critic: length` and `critic_params: {target: 50}` in the critique node, and the module in
the config's `plugins:`, deploy it behind the generic Serve deployment (`deployment`).
Importing this package registers the built-ins; their heavy imports (vLLM, httpx, Ray)
happen in their constructors, inside the replica.
"""
from rltf_ray.critics.base import (Critic, CriticItemError, critic_names, get_critic,
                                   register_critic)
from rltf_ray.critics import judges, learned, programmatic  # noqa: F401  (registers the built-ins)
from rltf_ray.critics.programmatic import score_items

__all__ = ["Critic", "CriticItemError", "critic_names", "get_critic", "register_critic", "score_items"]
