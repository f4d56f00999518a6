"""The library's error types, in a module with no imports of its own, so that every room
can raise them without importing another room."""


class ConfigError(ValueError):
    """A configuration, pipeline-graph or plugin problem, raised before any Ray resource starts."""
