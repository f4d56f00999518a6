"""Process memory, sampled by the engines, the learner and the benchmarks (no other imports,
so that any room may use it)."""
import resource


def peak_rss_gb() -> float:
    """This process's peak resident memory in GiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def node_used_gb() -> float | None:
    """This machine's used memory in GiB: MemTotal - MemAvailable (what `free` calls
    "used", page cache excluded); None where /proc/meminfo does not exist."""
    try:
        with open("/proc/meminfo") as f:
            kib = {line.split(":")[0]: int(line.split()[1]) for line in f}
    except (OSError, ValueError, IndexError):
        return None
    return (kib["MemTotal"] - kib["MemAvailable"]) / 2 ** 20


class NodeMemory:
    """The driver's node's used memory, sampled every `every_s` seconds on a thread: the peak
    since the last `take()` (a step's) and over the whole run. Every process on the machine
    counts, so it is a run's footprint only where the run has the machine to itself."""

    def __init__(self, every_s: float = 1.0):
        import threading

        self.every_s, self.peak, self._since = every_s, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="node-memory", daemon=True)

    def _sample(self) -> None:
        while True:
            used = node_used_gb()
            if used is not None:
                self.peak = used if self.peak is None else max(self.peak, used)
                self._since = used if self._since is None else max(self._since, used)
            if self._stop.wait(self.every_s):
                return

    def start(self) -> "NodeMemory":
        self._thread.start()
        return self

    def take(self) -> float | None:
        got, self._since = self._since, None
        return got

    def stop(self) -> None:
        self._stop.set()
