"""Load on the standalone critic app over HTTP on 127.0.0.1 (bounded clients and time).

    .venv/bin/python benchmarks/bench_critic_load.py [--seconds 20] [--clients 1,8,64]

Deploys the programmatic arithmetic critic (serve/critic_app.py) on a local Ray, then for
each client count runs that many concurrent clients, each posting requests back to back
for --seconds, and prints requests/s, p50 and p99 latency and errors. Traffic goes only
to 127.0.0.1.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
PORT = 8299


def clients(n: int, seconds: float, url: str) -> tuple[list[float], int]:
    import requests

    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        s = requests.Session()
        i = 0
        while time.monotonic() < stop:
            a, b = (k * 7 + i) % 90 + 10, (k + i * 3) % 90 + 10
            body = {"response": f"<answer>{a + b + i % 2}</answer>", "meta": {"a": a, "b": b, "op": "+", "answer": a + b}}
            t = time.perf_counter()
            try:
                r = s.post(url, json=body, timeout=30)
                ok = r.status_code == 200 and "critique" in r.json()
            except Exception:
                ok = False
            with lock:
                if ok:
                    latencies.append(time.perf_counter() - t)
                else:
                    errors[0] += 1
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--clients", default="1,8,64")
    a = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from serve.critic_app import app_builder

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(app_builder({}), name="rltf_critic", route_prefix="/rltf_critic")
    url = f"http://127.0.0.1:{PORT}/rltf_critic"
    clients(2, 2.0, url)  # warm-up
    print(f"programmatic arithmetic critic, one replica, {a.seconds:.0f} s per row, {os.cpu_count()} cores")
    print("| clients | requests/s | p50 ms | p99 ms | errors |")
    print("| --- | --- | --- | --- | --- |")
    for n in (int(x) for x in a.clients.split(",")):
        lat, err = clients(n, a.seconds, url)
        lat.sort()
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
        print(f"| {n} | {len(lat) / a.seconds:.0f} | {1000 * statistics.median(lat):.1f} | "
              f"{1000 * p99:.1f} | {err} |", flush=True)
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
