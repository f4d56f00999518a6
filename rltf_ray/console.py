"""What a run says on its console: one `[rltf]` line each."""


def log(msg: str) -> None:
    print(f"[rltf] {msg}", flush=True)
