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
        self.checkpoint_at: set[int] = set()  # save(): checkpoints asked for after that many steps
        self.arrived = asyncio.Condition()  # a step's rows, a checkpoint request, or close()

    def _event(self, kind: str, step: int) -> asyncio.Event:
        return self.events.setdefault((kind, step), asyncio.Event())

    async def put_step(self, step: int, rows_ref: list) -> None:
        async with self.arrived:
            self.steps[step] = rows_ref
            self.arrived.notify_all()

    async def request_checkpoint(self, steps_done: int) -> None:
        """The driver's save(): the workers waiting for step `steps_done` checkpoint first."""
        async with self.arrived:
            self.checkpoint_at.add(steps_done)
            self.arrived.notify_all()

    async def put_saved(self, steps_done: int) -> None:
        self._event("saved", steps_done).set()

    async def get_saved(self, steps_done: int, timeout_s: float) -> bool | None:
        try:
            await asyncio.wait_for(self._event("saved", steps_done).wait(), timeout_s)
        except asyncio.TimeoutError:
            return None
        return True

    async def release(self, before: int) -> None:
        for old in [s for s in self.steps if s < before]:  # covered by a checkpoint
            del self.steps[old]

    async def get_step(self, step: int, checkpointed: bool = False) -> list | str | None:
        """The step's rollouts, once the driver has put them; "checkpoint" when the driver
        asked for a checkpoint before this step and the caller has not yet written it; None
        if the driver closed the broker first (it stopped the run), which ends the loop."""
        def ready() -> bool:
            return self.closed or step in self.steps or (step in self.checkpoint_at and not checkpointed)

        async with self.arrived:
            await self.arrived.wait_for(ready)
        if step in self.checkpoint_at and not checkpointed and step not in self.steps and not self.closed:
            return "checkpoint"
        return self.steps.get(step)

    async def close(self) -> None:
        """No more steps will come: wake the workers waiting for one. Every worker sees the
        same answer for a step, since a step put before this stays until a checkpoint covers it."""
        async with self.arrived:
            self.closed = True
            self.arrived.notify_all()

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
