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


def _subclasses(cls: type) -> set[str]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub.__name__} | _subclasses(sub)
    return out


def cause_line(exc: BaseException) -> str:
    """The one line that says why a run failed. Ray Data and Ray wrap an error raised in a
    stage several times (RayTaskError, UserCodeException, ...) and end with their own advice;
    the line names the innermost `StageFailure` in the chain, else the innermost exception.
    A remote error crosses processes pickled, which drops Python's chain: what is left of the
    original is the text of Ray's copy of its traceback, read for a StageFailure's line."""
    seen, chain, e = set(), [], exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        # RayTaskError keeps the remote exception in `cause`; Python's chain in __cause__
        # (and __context__, unless `raise ... from None` hid it)
        cause = getattr(e, "cause", None)
        e = cause if isinstance(cause, BaseException) else (
            e.__cause__ or (None if e.__suppress_context__ else e.__context__))
    # the innermost: outer ones are Ray's copies of it or a stage's wrapper of a function's
    named = [x for x in chain if isinstance(x, StageFailure)]
    if named:
        last = named[-1]
        text = str(last).strip().splitlines()
        return f"{type(last).__name__}: {text[0] if text else '(no message)'}"
    import re

    # plain class names only: Ray's dual classes ("RayTaskError(RewardFunctionError)") are
    # subclasses too
    names = "|".join(sorted(n for n in _subclasses(StageFailure) | {"StageFailure"} if n.isidentifier()))
    line = re.compile(rf"^(?:[\w.]+\.)?({names}): (.+)$", re.M)
    found = [m for x in chain for m in line.finditer(f"{getattr(x, 'traceback_str', '')}\n{x}")]
    if found:
        return f"{found[-1].group(1)}: {found[-1].group(2).strip()}"
    last = chain[-1]
    text = str(last).strip().splitlines()
    return f"{type(last).__name__}: {text[0] if text else '(no message)'}"
