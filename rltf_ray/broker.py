"""The hand-off between the driver, which produces each step's rollouts, and the Ray Train
workers, which train on them and report back: one small async actor per run."""
from __future__ import annotations

import asyncio

import ray


@ray.remote(num_cpus=0)
class StepBroker:
    """Hand-off between the driver (producer of rollouts) and the trainer workers.

    A step's rollouts stay here until a checkpoint covers them (`release`), so training
    workers that Ray Train restarts from the last checkpoint can train those steps again;
    the trainer announces the step it starts from (`set_start`) once the engines serve the
    weights it restored, and the driver waits for that before its first rollout."""

    def __init__(self):
        self.steps: dict[int, list] = {}
        self.results: dict[int, dict] = {}
        self.events: dict[tuple[str, int], asyncio.Event] = {}
        self.start: int | None = None
        self.recent: list[dict] = []
        self.restarts = -1  # set_start is called once per (re)start of the worker group
        self.weights: dict[str, tuple[list, int]] = {}
        self.closed = False

    def _event(self, kind: str, step: int) -> asyncio.Event:
        return self.events.setdefault((kind, step), asyncio.Event())

    async def put_step(self, step: int, rows_ref: list) -> None:
        self.steps[step] = rows_ref
        self._event("step", step).set()

    async def release(self, before: int) -> None:
        for old in [s for s in self.steps if s < before]:  # covered by a checkpoint
            del self.steps[old]

    async def get_step(self, step: int) -> list | None:
        """The step's rollouts, once the driver has put them; None if the driver closed the
        broker first (it stopped the run), which ends the training loop."""
        if not self.closed:
            await self._event("step", step).wait()
        return self.steps.get(step)

    async def close(self) -> None:
        """No more steps will come: wake the workers waiting for one. Every worker sees the
        same answer for a step, since a step put before this stays until a checkpoint covers it."""
        self.closed = True
        for (kind, _), event in self.events.items():
            if kind == "step":
                event.set()

    async def set_start(self, step: int, recent: list[dict]) -> None:
        """`recent`: the restored checkpoint's training metrics of the steps before `step`."""
        self.start, self.recent, self.restarts = step, recent, self.restarts + 1
        self._event("start", 0).set()

    async def restored_metrics(self) -> list[dict]:
        return self.recent

    async def get_start(self, timeout_s: float) -> int | None:
        try:
            await asyncio.wait_for(self._event("start", 0).wait(), timeout_s)
        except asyncio.TimeoutError:
            return None
        return self.start

    async def keep_weights(self, slot: str, refs: list, version: int) -> None:
        """The latest weights pushed to a model's engines (`slot`: actor or critic), kept so
        that an engine Ray restarts loads them before it serves again.

        Kept as the fetched payload, not as its reference: the reference is owned by the
        training worker that put it, and once that worker exits (Ray Train shuts the group
        down after the last step, or a failure kills it) the object is lost with its owner.
        The fetched numpy arrays are zero-copy views that pin the object store's memory for
        as long as they live, whoever owned the object."""
        self.weights[slot] = (await refs[0], version)

    async def latest_weights(self, slot: str):
        """(payload, version), or None before the first push."""
        return self.weights.get(slot)

    async def stats(self) -> dict:
        return {"held_steps": sorted(self.steps), "restarts": self.restarts}

    async def put_result(self, step: int, metrics: dict) -> None:
        self.results[step] = metrics
        self._event("result", step).set()

    async def get_result(self, step: int, timeout_s: float) -> dict | None:
        try:
            await asyncio.wait_for(self._event("result", step).wait(), timeout_s)
        except asyncio.TimeoutError:
            return None
        return self.results.pop(step)
