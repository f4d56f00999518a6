"""Two RL steps of the whole pipeline on the tiny model with real Ray Data, vLLM, Serve,
Ray Train and DeepSpeed, on a Ray started in-process."""
import json
import math
import os
import time

import pyarrow.parquet as pq
import pytest
import ray
import requests
import torch
from safetensors.torch import load_file

from rltf_ray.tracking import run_tag

from rltf_ray.loading import load_config
from rltf_ray.graph import KINDS
from rltf_ray.runner import Pipeline
from conftest import engine_logprobs, undocumented_keys  # noqa: E402

pytestmark = pytest.mark.integration
PORT = 8123
METRICS = 8124


def scrape_until(url: str, needle: str, timeout: float) -> str:
    """Prometheus text from Ray's metrics agent once it shows `needle` (export is periodic)."""
    import time

    deadline, text = time.time() + timeout, ""
    while time.time() < deadline:
        try:
            text = requests.get(url, timeout=10).text
        except requests.RequestException:
            pass
        if needle in text:
            return text
        time.sleep(2)
    return text


def gauge(text: str, name: str, run: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'run="{run}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for run {run} not exported")


def in_flight(text: str) -> list[float]:
    """Every exported `ray_rltf_stage_rows_in_flight` value (one series per Ray Data worker)."""
    return [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
            if ln.startswith("ray_rltf_stage_rows_in_flight{")]


def series_sum(text: str, name: str, tag: str) -> float:
    """Sum of every exported series `name{...}` whose labels contain `tag` (one per worker or
    replica); fails when there is none."""
    vals = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
            if ln.startswith(name + "{") and tag in ln]
    assert vals, f"{name} with {tag} not exported"
    return sum(vals)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_path):
    out = tmp_path_factory.mktemp("run")
    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"run.output_dir={out}", "run.steps=2", f"run.serve_http_port={PORT}",
                       "run.checkpoint_every=1", "loss.lambda_fm=0.1", f"run.metrics_export_port={METRICS}",
                       "run.eval_every=1", "eval.feedback_rounds=1", "engine.block_size=32",
                       "engine.nice=5", "trainer.mini_batch_size=24", "trainer.lr_schedule=linear",
                       "trainer.lr_warmup_steps=1"])
    p = Pipeline(cfg)
    p.start()
    try:
        probe = ([1, 5, 9, 13], [17, 21, 25, 29, 33])
        before = engine_logprobs(p.engines[0], *probe)
        app = p.critic_params.app_name  # the run's own: rltf_critic_<run id>
        assert app == f"rltf_critic_{p.run_id}"
        http = requests.post(f"http://127.0.0.1:{PORT}/{app}",
                             json={"response": "<answer>7</answer>", "meta": {"answer": 5}}, timeout=30)
        summary = p.train()
        after = engine_logprobs(p.engines[0], *probe)
        # the run's last values: policy version 2 (gauge lines end with the value)
        needle = f'run="{run_tag(out)}"'
        scraped = ""
        for _ in range(30):
            scraped = scrape_until(f"http://127.0.0.1:{METRICS}/metrics", needle, 30)
            if any(ln.startswith("ray_rltf_policy_version{") and needle in ln and ln.endswith(" 2.0")
                   for ln in scraped.splitlines()):
                break
            time.sleep(2)
        # A Ray Data worker that Ray stopped between exporting "16 rows in flight" and exporting
        # 0 leaves that value in the agent until its gauge TTL (two report intervals) runs out;
        # CI once scraped it. A live worker keeps re-exporting its current value, so a count
        # that never returned to 0 would still show after this wait.
        for _ in range(40):
            if all(v == 0 for v in in_flight(scraped)):
                break
            time.sleep(2)
            scraped = scrape_until(f"http://127.0.0.1:{METRICS}/metrics", needle, 30)
        dash = "http://" + ray._private.worker.get_dashboard_url()
        apps = requests.get(f"{dash}/api/serve/applications/", timeout=30).json()
        actors = requests.get(f"{dash}/api/v0/actors?limit=1000", timeout=30).json()
        # a fresh engine on the final checkpoint must reproduce the synced engine
        from rltf_ray.stages.engine import start_engines

        ckpt = out / "checkpoints" / "step_2"
        fresh = start_engines(str(ckpt), cfg.engine, p.dtype, 0)[0]
        from_ckpt = engine_logprobs(fresh, *probe)
        gen = ray.get(fresh.generate.remote([probe[0]], n=2, temperature=1.0, top_p=1.0, max_tokens=8))
        ray.kill(fresh)
        yield dict(out=out, cfg=cfg, summary=summary, before=before, after=after,
                   from_ckpt=from_ckpt, gen=gen, http=http, scraped=scraped, apps=apps, actors=actors,
                   run_name=run_tag(out), app=app)
    finally:
        p.stop()


def test_every_row_passes_every_stage(run):
    cfg = run["cfg"]
    n = dict(cfg.node("generate").params)["n"] * dict(cfg.node("source").params)["prompts_per_step"]
    for step in range(2):
        t = pq.read_table(run["out"] / "rollouts" / f"step_{step}.parquet")
        assert t.num_rows == n
        for kind in ("source", "generate", "critique", "revise", "reward"):
            assert set(KINDS[kind].writes) <= set(t.column_names), kind
        rows = t.to_pylist()
        assert all(r["step"] == step and r["policy_version"] == step for r in rows)
        assert all(len(r["response_ids"]) > 0 for r in rows)
        # early termination: a right first answer gets no critique and no revision; every
        # wrong one is critiqued (the programmatic critic does not fail) and revised
        assert all(r["revised"] == (not r["correct_first"]) for r in rows)
        assert all(bool(r["critique"]) == r["revised"] for r in rows)
        assert all(len(r["response_logprobs"]) == len(r["response_ids"]) for r in rows)
        assert all(len(r["revision_ids"]) > 0 for r in rows if r["revised"])
        assert len({(r["prompt_id"], r["sample_idx"]) for r in rows}) == n
        # x1 starts with x0 + y0, which the first turn just computed: vLLM's prefix cache
        # serves whole 32-token blocks of it (engine.block_size below; at vLLM's CPU default
        # of 128 these short prompts share none), and the metric is the served share
        prompt, cached = (sum(len(r["revision_prompt_ids"]) for r in rows),
                          sum(r["revision_cached_tokens"] for r in rows))
        assert all(r["revision_cached_tokens"] <= len(r["revision_prompt_ids"]) for r in rows)
        m = json.loads((run["out"] / "metrics.jsonl").read_text().splitlines()[step])
        assert m["revision_prompt_tokens"] == prompt and 0 < cached
        assert m["revision_cached_fraction"] == pytest.approx(cached / prompt)


def test_losses_finite_and_metrics_keys(run):
    lines = [json.loads(x) for x in (run["out"] / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    keys = ["step", "policy_version", "loss", "loss_grpo", "loss_sd", "loss_fm", "reward_first_mean",
            "reward_second_mean", "first_turn_accuracy", "second_turn_accuracy",
            "generate_tokens_per_s", "seconds_step"]
    for m in lines:
        assert all(k in m for k in keys)
        assert all(math.isfinite(m[k]) for k in ("loss", "loss_grpo", "loss_sd", "loss_fm"))
        assert m["loss_fm"] > 0 and m["generate_tokens_per_s"] > 0
        # the trainer and the sampler, at one precision (bf16 with fp32 heads on a CPU with
        # native bf16, else fp32), agree closely on the sampled tokens at their sampling
        # temperature (tests/test_sampler_agreement.py)
        assert 0 <= m["logprob_abs_diff_mean"] < 0.05 and m["sampler_trainer_kl"] < 0.01
        # measured against pi_old over every optimizer step's RL tokens (tests/test_learn_step.py
        # checks the values); a step that trained no RL token scores a no-grad sample instead
        if m["rl_tokens_trained"]:
            assert m["mismatch_tokens"] == m["rl_tokens_trained"] and m["policy_drift_kl_k3"] >= 0
        else:
            assert m["mismatch_tokens"] > 0 and m["policy_drift_kl_k3"] is None
        # the rollout-correction metrics of the default (tis_token): the k3 KL and the share of
        # RL tokens whose weight the cap truncated
        assert m["sampler_kl_k3"] == m["sampler_trainer_kl"] and m["correction_masked_fraction"] is None
        trunc = m["correction_truncated_fraction"]  # null in a step that trained no RL token
        assert (trunc is None) == (m["rl_tokens_trained"] == 0) and (trunc is None or 0 <= trunc <= 1)
        # each process holds at least its model and torch (> 0.2 GiB), and less than the machine
        assert 0.2 < m["learner_peak_rss_gb"] < 24 and 0.2 < m["engine_peak_rss_gb"] < 24
        assert m["train_tokens"] > 0 and m["train_tokens_per_s"] > 0
        # rank 0's split of the learner's step: its parts are inside seconds_train
        parts = ("seconds_examples", "seconds_side_logprobs", "seconds_forward_backward", "seconds_optimizer")
        assert m["seconds_forward_backward"] > 0 and m["seconds_optimizer"] > 0
        assert sum(m[k] for k in parts) <= m["seconds_train"]
    assert [m["policy_version"] for m in lines] == [1, 2]  # one weight push per RL step
    # several optimizer steps per RL step (trainer.mini_batch_size=24), at the schedule's rate
    from rltf_ray.learner import lr_at

    for m in lines:
        n = sum(m[f"examples_{t}"] for t in ("rl0", "rl1", "sd", "fm", "sft"))
        assert m["optimizer_steps"] == math.ceil(n / 24) >= 2
        assert m["lr"] == pytest.approx(lr_at(m["step"], run["cfg"].trainer, 2))
    assert lines[0]["lr"] == pytest.approx(run["cfg"].trainer.lr / 2)  # warmup: (0+1)/(1+1)
    # what the run was: the code, both precisions, the resolved loss and the learning rate
    prov = run["summary"]["provenance"]
    assert prov["engine_dtype"] in ("bfloat16", "float32") and prov["learner_dtype"] == prov["engine_dtype"]
    assert prov["head_dtype"] == "float32"  # the default: fp32 logits on both sides
    assert prov["loss"]["rollout_correction"] == "tis_token" and prov["lr"] == run["cfg"].trainer.lr
    assert prov["commit"] is None or len(prov["commit"].split("-")[0]) == 40
    # run.checkpoint_every=1: each step writes one, and its seconds are part of the step's
    assert all(0 < m["seconds_checkpoint"] < m["seconds_step"] for m in lines)
    # docs/metrics.md has a line for every key the run wrote
    assert [undocumented_keys(m, "metrics.jsonl") for m in lines] == [[], []]
    evals = [m["eval"] for m in lines] + [run["summary"][k] for k in ("before", "after")]
    assert [undocumented_keys(e, "Held-out evaluation") for e in evals] == [[]] * 4
    assert undocumented_keys(run["summary"], "summary.json") == []


def test_eval_every_step_and_the_last_one_is_the_after_eval(run):
    lines = [json.loads(x) for x in (run["out"] / "metrics.jsonl").read_text().splitlines()]
    assert "feedback_accuracy_1" not in lines[0]["eval"]  # during training: greedy only
    # the last step's evaluation runs every measure and stands as "after" (not run twice)
    after = run["summary"]["after"]
    assert "feedback_accuracy_1" in after and lines[1]["eval"] == after
    assert lines[1]["samples_seen"] == 32 and after["problems"] == 16


def test_weights_changed_and_engines_serve_new_version(run, tiny_path):
    init = load_file(f"{tiny_path}/model.safetensors")
    final = load_file(str(run["out"] / "checkpoints" / "step_2" / "model.safetensors"))
    assert set(init) == set(final)
    assert any(not torch.equal(init[k].float(), final[k].float()) for k in init)
    # the step-1 checkpoint holds the weights after one step: neither the initial ones nor the final
    first = load_file(str(run["out"] / "checkpoints" / "step_1" / "model.safetensors"))
    assert any(not torch.equal(init[k].float(), first[k].float()) for k in init)
    assert any(not torch.equal(first[k].float(), final[k].float()) for k in init)
    assert run["summary"]["engine_versions"] == [2]
    assert run["summary"]["after"]["version"] == 2 and run["summary"]["before"]["version"] == 0
    # every trained step is covered by a checkpoint (none held for a restart), no restart
    assert run["summary"]["trainer"] == {"held_steps": [], "restarts": 0}
    critic = run["summary"]["critic_app"]
    assert critic["requests"] >= critic["batches"] > 0  # the critic app served the run, batched


def test_engine_logprobs_changed_after_sync_and_match_checkpoint(run):
    before, after, ckpt = run["before"], run["after"], run["from_ckpt"]
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-3
    # the checkpoint loaded in a fresh vLLM engine gives the synced engine's log-probs
    assert max(abs(a - c) for a, c in zip(after, ckpt)) < 2e-2
    out = run["gen"]["outputs"][0]
    assert len(out) == 2 and all(len(o.token_ids) > 0 for o in out)


def test_critic_over_http(run):
    r = run["http"]
    assert r.status_code == 200
    body = r.json()
    assert body["correct"] is False and "too high" in body["critique"] and "5" not in body["critique"]


def test_dashboard_metrics_and_named_actors(run):
    """ray_rltf_* gauges reach Prometheus with the last step's values; the dashboard lists the
    critic app and the run's named actors."""
    text, name = run["scraped"], run["run_name"]
    last = json.loads((run["out"] / "metrics.jsonl").read_text().splitlines()[-1])
    assert gauge(text, "ray_rltf_policy_version", name) == 2 and gauge(text, "ray_rltf_step", name) == 1
    assert gauge(text, "ray_rltf_first_turn_accuracy", name) == pytest.approx(last["first_turn_accuracy"])
    assert gauge(text, "ray_rltf_engine_version_lag", name) == 0  # strictly on-policy
    assert gauge(text, "ray_rltf_engine_peak_rss_gb", name) == pytest.approx(last["engine_peak_rss_gb"])
    assert 'phase="rollout"' in text and "ray_rltf_step_seconds" in text
    # from inside the replica (a counter may be exported with or without Prometheus' _total)
    critic = [n for n in ("ray_rltf_critic_requests", "ray_rltf_critic_requests_total") if n + "{" in text]
    assert critic and series_sum(text, critic[0], "ProgrammaticCritic") > 0
    assert "ray_rltf_critic_latency_ms_bucket" in text
    # the driver counts the rows every pipeline node finished: each row of both steps
    rows = [n for n in ("ray_rltf_stage_rows", "ray_rltf_stage_rows_total") if n + "{" in text]
    assert rows, "ray_rltf_stage_rows not exported"
    cfg = run["cfg"]
    per_step = dict(cfg.node("generate").params)["n"] * dict(cfg.node("source").params)["prompts_per_step"]
    for stage in ("first_turn", "critic", "revision", "score"):
        assert series_sum(text, rows[0], f'stage="{stage}"') == 2 * per_step, stage
    # the Ray Data workers' live gauges: whichever worker still exports one has nothing in
    # flight (the fixture waited out the stale value of a worker Ray had stopped)
    assert all(v == 0 for v in in_flight(text)), in_flight(text)
    apps = run["apps"]["applications"]
    assert apps[run["app"]]["status"] == "RUNNING"
    alive = [a for a in run["actors"]["data"]["result"]["result"] if a["state"] == "ALIVE"]
    engine = [a for a in alive if (a.get("name") or "").startswith("rltf/engine-")]
    broker = [a for a in alive if (a.get("name") or "").startswith("rltf/broker-")]
    assert len(engine) == 1 and len(broker) == 1
    # the engine at engine.nice; other workers at Ray's default for workers, 15
    assert os.getpriority(os.PRIO_PROCESS, engine[0]["pid"]) == 5
    assert os.getpriority(os.PRIO_PROCESS, broker[0]["pid"]) == 15


def test_tensorboard_events_hold_each_steps_metrics(run):
    import struct

    from tensorboardX.proto.event_pb2 import Event

    [events] = (run["out"] / "tensorboard").glob("events.out.tfevents.*")
    data, i, scalars = events.read_bytes(), 0, {}
    while i < len(data):  # TFRecord: u64 length, u32 crc, payload, u32 crc
        (n,) = struct.unpack("<Q", data[i:i + 8])
        e = Event.FromString(data[i + 12:i + 12 + n])
        i += 16 + n
        scalars.update({(v.tag, e.step): v.simple_value for v in e.summary.value})
    rows = [json.loads(x) for x in (run["out"] / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        for key in ("loss", "reward_first_mean", "seconds_train"):
            assert scalars[(key, row["step"])] == pytest.approx(row[key], rel=1e-6), (key, row["step"])
