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


class StageFailure(RuntimeError):
    """An error raised inside a pipeline stage whose message names what failed (the stage
    or the function), the row and the exception: the line a failed run ends with."""


def cause_line(exc: BaseException) -> str:
    """The one line that says why a run failed. Ray Data and Ray wrap an error raised in a
    stage several times (RayTaskError, UserCodeException, ...) and end with their own advice;
    the line names the first `StageFailure` in the chain, else the innermost exception."""
    seen, chain, e = set(), [], exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        # RayTaskError keeps the remote exception in `cause`; Python's chain in __cause__
        e = getattr(e, "cause", None) if isinstance(getattr(e, "cause", None), BaseException) else (
            e.__cause__ or e.__context__)
    # the innermost: outer ones are Ray's copies of it or a stage's wrapper of a function's
    named = [x for x in chain if isinstance(x, StageFailure)]
    last = named[-1] if named else chain[-1]
    text = str(last).strip().splitlines()
    return f"{type(last).__name__}: {text[0] if text else '(no message)'}"
