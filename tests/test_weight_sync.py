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
