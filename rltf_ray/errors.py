"""The library's error types, in a module with no imports of its own, so that every room
can raise them without importing another room."""


class ConfigError(ValueError):
    """A configuration, pipeline-graph or plugin problem, raised before any Ray resource starts."""


class DeadCriticError(RuntimeError):
    """The learned critic trained on nothing for binac.max_dead_updates updates in a row."""


# What the command line leaves when a guard stops a run: the file beside its metrics, and
# the exit status (a comparison reports such a run as stopped and goes on with the others).
STOPPED_FILE = "stopped.json"
DEAD_CRITIC_EXIT = 3
