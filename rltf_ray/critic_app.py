"""A run's critic app on Serve: its name, the start of Serve itself, and the app's life from
deployment (or attachment to another run's app) to deletion by whoever holds it last."""
from __future__ import annotations

import time

from rltf_ray.console import log


def critic_app_name(crit, run_id: str, running: set[str]) -> str:
    """The Serve app name a run's critic lives under (`CritiqueParams.app_name`): its own
    `rltf_critic_<run id>` unless one is given; a given name must already run with attach and
    must not with a deployment, which would replace another run's critic in place."""
    if crit.attach:
        name = crit.app_name or "rltf_critic"
        if name not in running:
            raise RuntimeError(f"critique node: attach=true but no Serve app named '{name}' is running "
                               f"(running: {', '.join(sorted(running)) or 'none'})")
        return name
    if crit.app_name is None:
        return f"rltf_critic_{run_id}"
    if crit.app_name in running:
        raise RuntimeError(f"critique node: a Serve app named '{crit.app_name}' is already running on this "
                           "cluster (another run's critic?); deploying would replace it. Leave app_name "
                           "unset for a name of this run's own, or set attach=true to share that app")
    return crit.app_name


def start_serve(port: int) -> None:
    """Serve on this cluster: started, or joined when it runs already. Two runs starting at
    the same moment race to create Serve's controller; the loser joins the winner's."""
    from ray import serve

    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    except ValueError as e:  # ray.exceptions.ActorAlreadyExistsError
        if "SERVE_CONTROLLER_ACTOR" not in str(e):
            raise
        serve.start(http_options={"host": "127.0.0.1", "port": port})


class CriticApp:
    """The app this run's critique stages call (`params.app_name`), and this run's hold on it.
    On a Ray of the run's own (`own_ray`) no other run can use the app, so no lease is taken."""

    def __init__(self, params, own_ray: bool):
        self.params, self.own_ray = params, own_ray
        self.lease = None
        self.deployed = False  # from deployment on, close() deletes it, deployed or half so

    def open(self, task, learned: dict | None, plugins, http_port: int) -> None:
        """Deploy the app, or attach to the running one of that name."""
        from ray import serve

        from rltf_ray import reaper
        from rltf_ray.stages.critique import build_critic_app

        name, t = self.params.app_name, time.perf_counter()
        if self.params.attach:
            # an app another run deployed stays while this run uses it, even if that run ends
            # first; whoever holds it last deletes it (rltf_ray.reaper)
            self.lease = None if self.own_ray else reaper.attach(name)
        else:
            start_serve(http_port)
            # on a Ray that outlives this process, the app goes with it even if this process
            # dies without close() (a killed job, a trial's lost node), deploying included,
            # unless an attached run still holds it: rltf_ray.reaper
            self.lease = None if self.own_ray else reaper.watch(name)
            self.deployed = True
            serve.run(build_critic_app(task, self.params, learned, plugins=plugins),
                      name=name, route_prefix=f"/{name}")
        log(f"critic app '{name}' ready ({time.perf_counter() - t:.1f}s)")

    def close(self) -> None:
        """Let go of the app. The run that deployed it deletes it unless another run still
        holds it; an attached run, only when it held the app last (an app no run deployed is
        never deleted). A second close does nothing."""
        from ray import serve

        from rltf_ray import reaper

        name = self.params.app_name
        held = reaper.release(name, self.lease) if self.lease is not None else "unheld"
        self.lease = None
        if held == "last" or (self.deployed and held != "others"):
            serve.delete(name)
            if held == "last":  # the reaper held the name meanwhile, so no run attached to it
                reaper.deleted(name)
        elif self.deployed:
            log(f"critic app '{name}' stays: another run attached to it still uses it (it goes when the "
                "last one ends)")
        self.deployed = False
