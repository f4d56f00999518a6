"""Critics as plugins: the registry and the result contract (pure), and user critics from a
module file outside the package deployed behind the generic Serve deployment."""
import json
import textwrap

import numpy as np
import pytest

from rltf_ray.config import ConfigError, TaskConfig
from rltf_ray.critics import base, critic_names, get_critic, register_critic
from rltf_ray.critics.base import (CriticItemError, check_critic_params, check_result, check_results,
                                   critic_item)
from rltf_ray.graph import CritiqueParams

BUILT_IN = ["correctness_only", "learned", "llm_judge", "openai", "programmatic"]


@pytest.fixture
def registry():
    """The registry as it was, restored after a test that registers critics of its own."""
    saved = dict(base._REGISTRY)
    yield base._REGISTRY
    base._REGISTRY.clear()
    base._REGISTRY.update(saved)


def test_built_ins_are_registered_by_the_decorator(registry):
    from rltf_ray.critics.judges import LLMJudgeCritic, OpenAICritic
    from rltf_ray.critics.learned import LearnedCritic
    from rltf_ray.critics.programmatic import CorrectnessOnlyCritic, ProgrammaticCritic

    assert [n for n in critic_names() if n in BUILT_IN] == BUILT_IN
    assert [get_critic(n) for n in BUILT_IN] == [CorrectnessOnlyCritic, LearnedCritic, LLMJudgeCritic,
                                                  OpenAICritic, ProgrammaticCritic]


def test_register_lookup_and_clear_errors(registry):
    @register_critic("unit_const")
    class Const:
        def __init__(self, task, value: float = 1.0):
            self.value = value

        def judge(self, items):
            return [{"reward": self.value, "correct": True, "critique": "ok"} for _ in items]

    assert get_critic("unit_const") is Const and "unit_const" in critic_names()
    assert register_critic("unit_const")(Const) is Const  # the same class again: no clash

    with pytest.raises(ValueError, match=r"already registered by .*Const"):
        @register_critic("unit_const")
        class Other:
            def judge(self, items):
                return []
    with pytest.raises(TypeError, match="judge"):
        register_critic("unit_nojudge")(type("NoJudge", (), {}))
    with pytest.raises(TypeError, match="judge"):  # the base class's judge is no judge
        register_critic("unit_basejudge")(type("BaseJudge", (base.Critic,), {}))
    with pytest.raises(ConfigError) as e:
        get_critic("unit_missing")
    assert "unknown critic 'unit_missing'" in str(e.value)
    known = str(e.value).split("known: ")[1].split(";")[0].split(", ")  # other tests' plugins may add names
    assert known == sorted(known) and {"correctness_only", "learned", "llm_judge", "openai", "programmatic",
                                        "unit_const"} <= set(known)

    # the node's critic_params are checked against the constructor before anything starts
    assert CritiqueParams(critic="unit_const", critic_params={"value": 0.5}).critic_params == {"value": 0.5}
    with pytest.raises(ConfigError, match=r"critic_params \['valu'\] do not fit critic 'unit_const'.*'valu'"):
        CritiqueParams(critic="unit_const", critic_params={"valu": 0.5})
    with pytest.raises(ConfigError, match="critic 'llm_judge' takes none"):
        check_critic_params("llm_judge", get_critic("llm_judge"), {"model_path": "x"})
    with pytest.raises(ConfigError, match=r"unknown critic 'nope' \(known: .*programmatic"):
        CritiqueParams(critic="nope")


def test_unknown_name_loads_the_env_plugins_first(registry, tmp_path, monkeypatch):
    """A Ray worker knows the driver's plugins only through RLTF_RAY_PLUGINS."""
    (tmp_path / "rltf_env_critic_mod.py").write_text(textwrap.dedent("""
        from rltf_ray.critics import register_critic

        @register_critic("unit_from_env")
        class FromEnv:
            def __init__(self, task):
                pass

            def judge(self, items):
                return []
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLTF_RAY_PLUGINS", "rltf_env_critic_mod")
    assert "unit_from_env" not in registry
    assert get_critic("unit_from_env").__module__ == "rltf_env_critic_mod"


def test_critic_item_normalises_requests():
    item = critic_item({"prompt": "Q", "response": "A", "meta": '{"answer": 3}', "verdict": True})
    assert item == {"prompt": "Q", "response": "A", "meta": {"answer": 3}, "verdict": True}
    assert critic_item({"response": "A", "meta": {}}) == {"prompt": "", "response": "A", "meta": {}}
    for bad in ({"response": 7, "meta": {}}, {"meta": {}}, {"response": "A"}, "text",
                {"response": "A", "meta": [1]}, {"response": "A", "meta": "{no"}, {"response": "A", "meta": {}, "prompt": 1}):
        with pytest.raises(ValueError, match="critic request must be"):
            critic_item(bad)


def test_results_are_checked_against_the_contract():
    owner = "'x' (m.X)"
    ok = check_result(owner, {"reward": 1, "correct": np.bool_(True), "critique": "c", "extra": [1]})
    assert ok == {"reward": 1.0, "correct": True, "critique": "c", "extra": [1], "format_ok": True}
    assert type(ok["reward"]) is float and type(ok["correct"]) is bool
    assert check_result(owner, {"reward": 0.25, "correct": False, "critique": "", "format_ok": False})["format_ok"] is False
    cases = [({"reward": 1.0, "critique": "c"}, r"critic 'x' \(m.X\): result lacks 'correct'"),
             ({"correct": True}, "lacks 'reward', 'critique'"),
             ({"reward": "1", "correct": True, "critique": "c"}, "'reward' must be a finite number, got str"),
             ({"reward": True, "correct": True, "critique": "c"}, "'reward' must be a finite number, got bool"),
             ({"reward": float("nan"), "correct": True, "critique": "c"}, "'reward' must be a finite number"),
             ({"reward": 1.0, "correct": "yes", "critique": "c"}, "'correct' must be a bool, got str"),
             ({"reward": 1.0, "correct": 1, "critique": "c"}, "'correct' must be a bool, got int"),
             ({"reward": 1.0, "correct": True, "critique": None}, "'critique' must be a str"),
             ({"reward": 1.0, "correct": True, "critique": "c", "format_ok": None}, "'format_ok' must be a bool"),
             ([1.0, True, "c"], "a result must be a dict with reward, correct, critique; got list")]
    for res, msg in cases:
        with pytest.raises(CriticItemError, match=msg):
            check_result(owner, res)

    good = {"reward": 0.5, "correct": False, "critique": "c"}
    out = check_results(owner, [1, 2, 3], [good, {"reward": 1}, KeyError("k")])
    assert out[0] == {**good, "format_ok": True}
    assert isinstance(out[1], CriticItemError) and "lacks 'correct', 'critique'" in str(out[1])
    # an error the critic put in an item's place is that item's, named after the critic
    assert isinstance(out[2], CriticItemError) and str(out[2]) == f"critic {owner}: KeyError: 'k'"
    for results, got in (([good], "1 results"), (None, "a NoneType"), ({"reward": 1}, "a dict")):
        out = check_results(owner, [1, 2], results)
        want = f"critic {owner}: judge() returned {got} for 2 items (one result per item expected)"
        assert [str(e) for e in out] == [want, want]


def test_build_critic_app_ships_the_plugins_beside_the_judges_env(tiny_path, tmp_path):
    from rltf_ray.plugins import worker_runtime_env
    from rltf_ray.stages.critique import build_critic_app

    plugin = tmp_path / "rltf_ship_mod.py"
    plugin.write_text("X = 1\n")
    shipped = worker_runtime_env([str(plugin)])
    dep = build_critic_app(TaskConfig(), CritiqueParams(critic="llm_judge", judge_model=tiny_path),
                           plugins=[str(plugin)])._bound_deployment
    env = dep.ray_actor_options["runtime_env"]
    assert dep.name == "LLMJudgeCritic" and dep.ray_actor_options["num_cpus"] == 1
    assert env["py_modules"] == shipped["py_modules"]
    assert env["env_vars"]["RLTF_RAY_PLUGINS"] == "rltf_ship_mod"
    assert env["env_vars"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the judge's engine env stays
    _, name, _, plugins, context = dep.init_args
    assert (name, plugins, context["model_path"]) == ("llm_judge", [str(plugin)], tiny_path)
    plain = build_critic_app(TaskConfig(), CritiqueParams())._bound_deployment
    assert plain.name == "ProgrammaticCritic" and "runtime_env" not in plain.ray_actor_options


PLUGIN = '''
"""User critics, defined outside the package."""
import asyncio
import os

from rltf_ray.critics import register_critic


@register_critic("plugin_length")
class LengthCritic:
    def __init__(self, task, target: int = 10, bonus: float = 0.0):
        self.task, self.target, self.bonus = task, target, bonus

    def judge(self, items):
        shipped = os.environ.get("RLTF_RAY_PLUGINS", "")
        job = os.environ.get("RLTF_TEST_JOB_VAR")  # the job's runtime_env reaches the replica
        return [{"reward": self.bonus + len(x["response"]) / self.target,
                 "correct": len(x["response"]) == self.target,
                 "critique": f"{self.task.name} a={x['meta']['a']} verdict={x.get('verdict')} env={shipped} job={job}"}
                for x in items]


@register_critic("plugin_async")
class AsyncCritic:
    def __init__(self, task):
        self.task = task

    async def judge(self, items):
        await asyncio.sleep(0.01)
        return [{"reward": 0.5, "correct": False, "format_ok": False, "critique": "async " + x["prompt"]}
                for x in items]


@register_critic("plugin_broken")
class BrokenCritic:
    def __init__(self, task):
        pass

    def judge(self, items):
        if any(x["response"] == "raise" for x in items):
            raise ValueError("asked to raise")
        out = []
        for x in items:
            if x["response"] == "no reward":
                out.append({"correct": True, "critique": "c"})
            elif x["response"] == "bad type":
                out.append({"reward": 1.0, "correct": "yes", "critique": "c"})
            else:
                out.append({"reward": 1.0, "correct": True, "critique": "fine"})
        return out[:-1] if any(x["response"] == "drop one" for x in items) else out
'''


@pytest.fixture(scope="module")
def plugin_serve(tmp_path_factory):
    import ray
    from ray import serve

    from rltf_ray.plugins import load_plugins

    path = tmp_path_factory.mktemp("user_code") / "rltf_test_plugin_critics.py"
    path.write_text(PLUGIN)
    load_plugins([str(path)])  # what the driver does before it validates the config
    # a job's own runtime_env, as `ray job submit --runtime-env-json` gives one (an API key)
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"RLTF_TEST_JOB_VAR": "from-the-job"}})
    serve.start(http_options={"host": "127.0.0.1", "port": 8134})
    yield str(path)
    serve.shutdown()
    ray.shutdown()


def deploy(plugins, name, critic, **kw):
    from ray import serve

    from rltf_ray.stages.critique import build_critic_app

    p = CritiqueParams(app_name=name, critic=critic, retries=0, timeout_s=30.0, **kw)
    serve.run(build_critic_app(TaskConfig(), p, plugins=plugins), name=name, route_prefix=f"/{name}")
    return p


def rows(responses):
    meta = json.dumps({"a": 40, "b": 2, "op": "+", "answer": 42})
    return [{"prompt": f"Q{i}", "response": r, "meta": meta, "correct_first": i % 2 == 0}
            for i, r in enumerate(responses)]


@pytest.mark.integration
def test_plugin_critics_from_a_file_through_serve(plugin_serve):
    from ray import serve

    from rltf_ray.stages.critique import ask_critic

    p = deploy([plugin_serve], "plug_len", "plugin_length", critic_params={"target": 4, "bonus": 0.25},
               batch_wait_timeout_s=0.5)
    assert list(serve.status().applications["plug_len"].deployments) == ["LengthCritic"]
    r = rows(["abcd", "ab", "abcdef"])
    out = ask_critic(p, r, [x["response"] for x in r], [0, 1, 2])
    assert {i: (res["reward"], res["correct"], res["format_ok"]) for i, (res, _) in out.items()} == {
        0: (1.25, True, True), 1: (0.75, False, True), 2: (1.75, False, True)}
    assert [out[i][0]["critique"] for i in range(3)] == [
        f"arithmetic a=40 verdict={v} env=rltf_test_plugin_critics job=from-the-job" for v in (True, False, True)]
    assert serve.get_app_handle("plug_len").stats.remote().result() == {"batches": 1, "requests": 3}

    p = deploy([plugin_serve], "plug_async", "plugin_async")
    out = ask_critic(p, r, [x["response"] for x in r], [1, 2])
    assert out == {1: ({"reward": 0.5, "correct": False, "format_ok": False, "critique": "async Q1"}, ""),
                   2: ({"reward": 0.5, "correct": False, "format_ok": False, "critique": "async Q2"}, "")}


@pytest.mark.integration
def test_a_plugin_critics_bad_results_fail_their_items_alone(plugin_serve):
    from ray import serve

    from rltf_ray.stages.critique import ask_critic

    owner = "critic 'plugin_broken' (rltf_test_plugin_critics.BrokenCritic)"
    p = deploy([plugin_serve], "plug_bad", "plugin_broken", batch_wait_timeout_s=0.5, max_batch_size=4)
    handle = serve.get_app_handle("plug_bad")
    r = rows(["ok", "no reward", "bad type", "ok"])
    out = ask_critic(p, r, [x["response"] for x in r], [0, 1, 2, 3])
    assert out[0] == out[3] == ({"reward": 1.0, "correct": True, "critique": "fine", "format_ok": True}, "")
    assert out[1][0] is None and f"{owner}: result lacks 'reward'" in out[1][1]
    assert out[2][0] is None and f"{owner}: result 'correct' must be a bool, got str" in out[2][1]
    assert handle.stats.remote().result() == {"batches": 1, "requests": 4}
    # a judge that raises for the batch: each item is judged alone, and only the culprit fails
    r = rows(["ok", "raise", "ok"])
    out = ask_critic(p, r, [x["response"] for x in r], [0, 1, 2])
    assert out[0][0]["critique"] == out[2][0]["critique"] == "fine"
    assert out[1][0] is None and f"{owner}: ValueError: asked to raise" in out[1][1]
    # too few results: no item of that batch can be matched to its result
    r = rows(["ok", "drop one"])
    out = ask_critic(p, r, [x["response"] for x in r], [0, 1])
    assert [res for res, _ in out.values()] == [None, None]
    assert all(f"{owner}: judge() returned 1 results for 2 items" in err for _, err in out.values())
    assert handle.stats.remote().result() == {"batches": 3, "requests": 9}
