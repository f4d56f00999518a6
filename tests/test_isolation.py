"""Runs that share a cluster stay apart: each deploys its critic under a name of its own and
never replaces (or, when it stops, deletes) another run's."""
import pytest

from rltf_ray.graph import CritiqueParams
from rltf_ray.services import critic_app_name


def test_each_run_deploys_its_critic_under_a_name_of_its_own():
    assert critic_app_name(CritiqueParams(), "ab12cd", {"rltf_critic_ff00aa"}) == "rltf_critic_ab12cd"
    assert critic_app_name(CritiqueParams(app_name="mine"), "ab12cd", set()) == "mine"
    with pytest.raises(RuntimeError, match="'mine' is already running on this cluster"):
        critic_app_name(CritiqueParams(app_name="mine"), "ab12cd", {"mine"})  # would replace it
    assert critic_app_name(CritiqueParams(attach=True), "ab12cd", {"rltf_critic"}) == "rltf_critic"
    with pytest.raises(RuntimeError, match="attach=true but no Serve app named 'judge' is running"):
        critic_app_name(CritiqueParams(attach=True, app_name="judge"), "ab12cd", {"rltf_critic"})


@pytest.mark.integration
def test_two_runs_on_one_ray_keep_their_own_critics(tmp_path):
    """Two runs started on one Ray: each deploys its own critic app; the first one's stop
    deletes only its own, and the second's critic still answers."""
    import ray
    from ray import serve

    from rltf_ray.loading import load_config
    from rltf_ray.runner import Pipeline
    from rltf_ray.stages.critique import ask_critic

    ray.init(num_cpus=4, include_dashboard=False)
    runs = [Pipeline(load_config("pipelines/configs/tiny.yaml", [f"run.output_dir={tmp_path / str(i)}",
                                                                  "run.serve_http_port=8177"]))
            for i in range(2)]
    try:
        for r in runs:
            r.start(train=False)
        a, b = (r.critic_params.app_name for r in runs)
        assert a != b and {a, b} <= set(serve.status().applications)
        runs[0].stop()
        assert a not in serve.status().applications and b in serve.status().applications
        row = {"prompt": "What is 2 + 3?", "meta": {"a": 2, "b": 3, "op": "+", "answer": 5}}
        [(res, err)] = ask_critic(runs[1].critic_params, [row], ["<answer>6</answer>"], [0]).values()
        assert res is not None and res["correct"] is False, err
    finally:
        runs[1].stop()
        serve.shutdown()
        ray.shutdown()
