"""Process memory, sampled by the engines, the learner and the benchmarks (no other imports,
so that any room may use it)."""
import resource


def peak_rss_gb() -> float:
    """This process's peak resident memory in GiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
