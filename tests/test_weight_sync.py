"""The object-store weight payload: exact round trips, and bytes that travel out of band."""
import os
import pickle
import signal
import time

import pytest
import torch

from rltf_ray.weight_sync.object_store import ObjectStoreSync, pack, unpack


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pack_unpack_round_trip_is_bit_exact(dtype):
    torch.manual_seed(0)
    named = [("a.weight", torch.randn(3, 5)), ("b.bias", torch.randn(7))]
    out = unpack(pack(named, dtype))
    assert [n for n, _ in out] == ["a.weight", "b.bias"]
    for (_, src), (_, got) in zip(named, out):
        assert got.dtype == dtype and got.shape == src.shape
        assert torch.equal(got, src.to(dtype))


def test_views_of_a_flat_buffer_travel_out_of_band_with_only_their_own_bytes():
    """DeepSpeed's parameters are views into one flat buffer: each must carry its own
    elements only, outside the pickle stream (which Ray writes into the object store once)."""
    flat = torch.arange(1000, dtype=torch.float32)
    named = [("w", flat[:100].view(10, 10)), ("b", flat[500:510])]
    buffers = []
    stream = pickle.dumps(pack(named, torch.float32), protocol=5, buffer_callback=buffers.append)
    assert len(stream) < 1000  # names and metadata only
    assert sorted(b.raw().nbytes for b in buffers) == [40, 400]
    got = dict(unpack(pickle.loads(stream, buffers=buffers)))
    assert torch.equal(got["w"], flat[:100].view(10, 10)) and torch.equal(got["b"], flat[500:510])


def test_tied_weights_travel_once_and_arrive_under_both_names():
    """A tied embedding and LM head are one tensor under two names: its bytes go into the
    object store once, and the engine still receives both names (vLLM decides what to skip)."""
    torch.manual_seed(0)
    emb = torch.randn(6, 4)
    other = torch.randn(6, 4)
    named = [("embed.weight", emb), ("norm.weight", torch.randn(4)), ("lm_head.weight", emb),
             ("head2.weight", other), ("first_rows", emb[:3])]  # equal shape or a slice: not the same tensor
    buffers = []
    stream = pickle.dumps(pack(named, torch.bfloat16), protocol=5, buffer_callback=buffers.append)
    assert sorted(b.raw().nbytes for b in buffers) == sorted([48, 8, 48, 24])  # no second 6x4 of emb
    got = unpack(pickle.loads(stream, buffers=buffers))
    assert [n for n, _ in got] == [n for n, _ in named]
    for (_, src), (_, t) in zip(named, got):
        assert torch.equal(t, src.to(torch.bfloat16))
    assert dict(got)["lm_head.weight"] is dict(got)["embed.weight"]


@pytest.mark.integration
def test_kept_weights_outlive_the_training_worker_that_pushed_them():
    """Ray Train shuts its workers down after the last step, and a failure kills them; an
    engine that Ray restarts after that still loads the last pushed weights from the broker
    (PolicyEngine._restore), although the worker that put them into the object store is gone."""
    import ray

    from rltf_ray.broker import StepBroker

    @ray.remote(num_cpus=0)
    class Pusher:
        def push(self, named, version):
            ObjectStoreSync(torch.bfloat16, ("weights-broker", "actor")).push(named, version)
            return os.getpid()

    torch.manual_seed(0)
    emb = torch.randn(6, 4)
    named = [("embed.weight", emb), ("norm.weight", torch.randn(4)), ("lm_head.weight", emb)]
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        broker = StepBroker.options(name="weights-broker").remote()
        pusher = Pusher.remote()
        os.kill(ray.get(pusher.push.remote(named, 3)), signal.SIGKILL)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(pusher.push.remote(named, 4))
        time.sleep(3)  # Ray frees a dead owner's objects asynchronously; kept references then fail
        payload, version = ray.get(broker.latest_weights.remote("actor"))
        got = dict(unpack(payload))
        assert version == 3 and list(got) == [n for n, _ in named]
        for name, t in named:
            assert torch.equal(got[name], t.to(torch.bfloat16))
    finally:
        ray.shutdown()


@pytest.mark.integration
@pytest.mark.slow  # the two-step run below covers the protocol in `make test`; this adds the held reference
def test_the_collective_protocol_over_gloo_loads_the_pushed_weights_and_holds_the_reference(tiny_path):
    """Trainer rank 0 (here the driver) and an engine's worker in one gloo group: the engine
    joins through the worker extension, receives every tensor in broadcast order, serves them
    as the pushed version, and keeps Bi-NAC's reference copy in its worker
    (weight_sync/collective.py; only the NCCL transport differs on a GPU)."""
    import ray
    from transformers import AutoModelForCausalLM

    from conftest import engine_logprobs
    from rltf_ray.config import EngineConfig
    from rltf_ray.stages.engine import start_engines
    from rltf_ray.weight_sync.factory import make_weight_sync

    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).state_dict()
    torch.manual_seed(0)
    moved = {k: v + 0.05 * torch.randn_like(v) for k, v in base.items()}
    probe = ([1, 5, 9, 13], [17, 21, 25, 29, 33])
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        cfg = EngineConfig(max_model_len=256)
        engine, = start_engines(tiny_path, cfg, "float32", 0, "gloo", reference_every=2)
        reference, = start_engines(tiny_path, cfg, "float32", 0)  # object-store engine: the expected values
        sync = make_weight_sync("gloo", torch.float32)
        sync.connect([engine])
        before = engine_logprobs(engine, *probe)
        sync.push(moved.items(), 1)
        assert ray.get(engine.ready.remote()) == 1
        plain = ObjectStoreSync(torch.float32)
        plain.connect([reference])
        plain.push(moved.items(), 1)
        after = engine_logprobs(engine, *probe)
        assert after != pytest.approx(before, abs=1e-3)  # the pushed weights, not the model on disk
        assert after == pytest.approx(engine_logprobs(reference, *probe), abs=1e-5)
        # version 2 is divisible by reference_every=2: the worker holds it as the reference
        sync.push(base.items(), 2)
        sync.push(moved.items(), 3)
        got = ray.get(engine.generate.remote([probe[0]], 1, 0.0, 1.0, 4, reference=True))
        assert got["version"] == 2  # served by the held reference copy ...
        assert engine_logprobs(engine, *probe) == pytest.approx(after, abs=1e-5)  # ... then version 3 again
        sync.close()
    finally:
        ray.shutdown()


@pytest.mark.integration
def test_a_tiny_run_trains_two_steps_over_the_collective_sync_on_cpu(tmp_path, tiny_path):
    """trainer.weight_sync=gloo: the NCCL path's protocol end to end on CPU (a Ray Train
    worker as rank 0, a vLLM engine joining through its worker extension); the engine then
    serves exactly the weights of the final checkpoint."""
    import ray

    from conftest import engine_logprobs
    from rltf_ray.loading import load_config
    from rltf_ray.runner import Pipeline
    from rltf_ray.stages.engine import start_engines

    out = tmp_path / "run"
    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"run.output_dir={out}", "run.steps=2", "run.checkpoint_every=2", "run.eval_before_after=false",
                       "trainer.weight_sync=gloo", "trainer.num_workers=1", "run.serve_http_port=8141",
                       "loss.lambda_fm=0.1"])  # FM trains whatever the rewards: the weights must move
    probe = ([1, 5, 9, 13], [17, 21, 25, 29, 33])
    p = Pipeline(cfg)
    p.start()
    try:
        before = engine_logprobs(p.engines[0], *probe)
        summary = p.train()
        served = engine_logprobs(p.engines[0], *probe)
        fresh = start_engines(str(out / "checkpoints" / "step_2"), cfg.engine, p.dtype, 0)[0]
        from_ckpt = engine_logprobs(fresh, *probe)
        ray.kill(fresh)
    finally:
        p.stop()
    assert summary["engine_versions"] == [2]
    assert served != pytest.approx(before, abs=1e-3)
    assert served == pytest.approx(from_ckpt, abs=2e-2 if p.dtype == "bfloat16" else 1e-4)
