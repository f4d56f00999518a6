import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")  # see runner.init_ray

import pytest  # noqa: E402

from rltf_ray.models import cache_dir  # noqa: E402


@pytest.fixture(scope="session")
def tiny_path() -> str:
    path = cache_dir() / "tiny"
    if not (path / "config.json").is_file():
        pytest.fail("the tiny model is not built; run `make models-tiny` (make test does it)")
    return str(path)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    from rltf_ray.chat import load_tokenizer

    return load_tokenizer(tiny_path)
