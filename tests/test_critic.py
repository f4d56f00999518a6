"""The critique stage against a real Serve deployment: batching, early termination,
correctness-only feedback, HTTP, and timeouts that mark rows instead of dropping them."""
import json

import pytest
import ray
import requests
from ray import serve

from rltf_ray.config import TaskConfig
from rltf_ray.graph import CritiqueParams, RewardParams
from rltf_ray.stages.critique import build_critic_app, make_critique, make_reward

pytestmark = pytest.mark.integration
TASK = TaskConfig(params={"min_digits": 2, "max_digits": 3})
PORT = 8131


@pytest.fixture(scope="module")
def serve_up():
    ray.init(num_cpus=4, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    yield
    serve.shutdown()
    ray.shutdown()


def deploy(name, **kw):
    p = CritiqueParams(app_name=name, **kw)
    serve.run(build_critic_app(TASK, p), name=name, route_prefix=f"/{name}")
    return p


def rows(answers):
    meta = {"a": 40, "b": 2, "op": "+", "answer": 42}
    return [{"prompt_id": "p", "step": 0, "prompt": "What is 40 + 2?", "meta": json.dumps(meta),
             "response": f"<answer>{a}</answer>"} for a in answers]


def test_early_termination_and_batching(serve_up):
    p = deploy("crit_et", batch_wait_timeout_s=0.5)
    out = make_critique(TASK, p)(rows([42, 41, 50, 42, 7, 43]))
    stats = serve.get_app_handle("crit_et").stats.remote().result()
    assert stats["requests"] == 4  # the two correct answers never reach the critic
    assert stats["batches"] < stats["requests"]
    assert [r["revised"] for r in out] == [False, True, True, False, True, True]
    assert [r["critique"] == "" for r in out] == [True, False, False, True, False, False]
    assert "too low" in out[1]["critique"] and "42" not in out[1]["critique"]
    assert [r["reward_first"] for r in out] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    no_et = make_critique(TASK, deploy("crit_all", early_termination=False))(rows([42, 41]))
    assert [r["critique"] for r in no_et][0] == "Your answer is correct."


def test_correctness_only_critic_and_http(serve_up):
    p = deploy("crit_co", critic="correctness_only")
    out = make_critique(TASK, p)(rows([41]))
    assert out[0]["critique"] == "Your previous answer was incorrect."
    r = requests.post(f"http://127.0.0.1:{PORT}/crit_co",
                      json={"response": "<answer>42</answer>", "meta": {"answer": 42}}, timeout=30)
    assert r.status_code == 200 and r.json()["critique"] == "Your previous answer was correct."


def test_timeouts_mark_rows_keep_rewards_and_lose_nothing(serve_up):
    # the replica holds each batch for 3 s, so every request outlives its 0.5 s timeout
    p = deploy("crit_slow", timeout_s=0.5, retries=1, backoff_s=0.01, batch_wait_timeout_s=3.0)
    out = make_critique(TASK, p)(rows([42, 41, 40]))
    assert len(out) == 3
    assert [r["critique_failed"] for r in out] == [False, True, True]
    assert all("Timeout" in r["critique_error"] or "timed out" in r["critique_error"].lower()
               for r in out[1:])
    assert [r["reward_first"] for r in out] == [1.0, 0.0, 0.0]  # the verifier's reward is kept
    scored = make_reward(TASK, RewardParams(), p)([dict(r, revision="") for r in out])
    assert [r["reward_second"] for r in scored] == [1.0, 0.0, 0.0]  # no revision for failed rows


def test_second_round_critiques_only_wrong_revisions_and_carries_scores(serve_up):
    """turns=3: round 2 judges y1; episodes that ended in round 1 keep their last score."""
    p = deploy("crit_rounds")
    one = make_critique(TASK, p, turns=3)(rows([42, 41, 41, 41]))
    assert [r["revised"] for r in one] == [False, True, True, True]
    revised = [dict(r, revision=f"<answer>{y}</answer>") for r, y in zip(one, ["", 42, 43, 30])]
    scored = make_reward(TASK, RewardParams(), p)(revised)
    assert [r["correct_second"] for r in scored] == [True, True, False, False]
    p2 = CritiqueParams(app_name="crit_rounds", round=2)
    two = make_critique(TASK, p2, turns=3)(scored)
    before = serve.get_app_handle("crit_rounds").stats.remote().result()["requests"]
    assert before == 3 + 2  # round 1 asked about 3 rows, round 2 only about the 2 wrong revisions
    assert [r["revised_2"] for r in two] == [False, False, True, True]
    assert "too high" in two[2]["critique_2"] and "too low" in two[3]["critique_2"]
    final = make_reward(TASK, RewardParams(round=2), p2)(
        [dict(r, revision_2=f"<answer>{y}</answer>") for r, y in zip(two, ["", "", 42, 41])])
    assert [r["correct_second_2"] for r in final] == [True, True, True, False]
    assert [r["reward_second_2"] for r in final] == [1.0, 1.0, 1.0, 0.0]
    assert not any(r["reward_failed_2"] for r in final)


def test_math_task_through_the_serve_critic(serve_up):
    """math-verify's own timeout needs the main thread; Serve runs user code on worker threads.
    Every parsable answer must be judged, none may end as critique_failed."""
    task = TaskConfig(name="math")
    p = CritiqueParams(app_name="crit_math")
    serve.run(build_critic_app(task, p), name="crit_math", route_prefix="/crit_math")
    meta = json.dumps({"question": "What is half of one?", "answer": "\\frac{1}{2}"})
    answers = ["\\boxed{0.5}", "\\boxed{\\frac{2}{4}}", "\\boxed{3}", "no box"]
    rows = [{"prompt_id": "m", "step": 0, "prompt": "What is half of one?", "meta": meta, "response": a}
            for a in answers]
    out = make_critique(task, p)(rows)
    assert [r["critique_failed"] for r in out] == [False] * 4
    assert [r["correct_first"] for r in out] == [True, True, False, False]
    assert out[2]["critique"] == "Your answer 3 is incorrect." and "could not be read" in out[3]["critique"]


def test_one_bad_item_fails_alone_and_http_rejects_bad_bodies(serve_up):
    from rltf_ray.stages.critique import MAX_REQUEST_BYTES, CriticItemError

    p = deploy("crit_items", batch_wait_timeout_s=0.5)
    handle = serve.get_app_handle("crit_items")
    good = {"response": "<answer>42</answer>", "meta": {"a": 40, "b": 2, "op": "+", "answer": 42}}
    calls = [handle.judge.remote(x) for x in (good, {"response": 7}, good, {"meta": {}})]
    assert calls[0].result()["correct"] and calls[2].result()["correct"]
    for bad in (calls[1], calls[3]):
        with pytest.raises(CriticItemError, match="critic request must be"):
            bad.result()
    assert handle.stats.remote().result()["batches"] == 1  # all four shared one batch
    url = f"http://127.0.0.1:{PORT}/crit_items"
    assert requests.post(url, data=b"x" * (MAX_REQUEST_BYTES + 1), timeout=30).status_code == 413
    r = requests.post(url, data=b"{not json", timeout=30)
    assert r.status_code == 400 and "not JSON" in r.json()["error"]
    r = requests.post(url, json={"response": 3}, timeout=30)
    assert r.status_code == 400 and "critic request must be" in r.json()["error"]
    assert requests.post(url, json=good, timeout=30).json()["correct"] is True


def test_a_killed_critic_replica_is_replaced_and_its_rows_retried(serve_up):
    """Serve replaces a dead replica; the rows sent meanwhile fail, are retried with backoff,
    and come back critiqued. Nothing ends `critique_failed` while a retry is left."""
    p = deploy("crit_kill", retries=6, backoff_s=0.5, timeout_s=20.0, early_termination=False)

    def replicas():
        return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == "serve" and "crit_kill" in a["name"] and "REPLICA" in a["name"]}

    [victim] = replicas()
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    out = make_critique(TASK, p)(rows([41, 50, 42]))
    assert [r["critique_failed"] for r in out] == [False, False, False], [r["critique_error"] for r in out]
    assert "too low" in out[0]["critique"] and [r["reward_first"] for r in out] == [0.0, 0.0, 1.0]
    assert replicas() and victim not in replicas()  # a new replica serves
