"""Bi-NAC's bilevel term and the paper's actor: the critic's reward with the reference actor by
hand, the waived format penalty, the actor's final-reward returns, the schedules, the bad
values; and on a real tiny vLLM engine, the reference actor it holds and the learned critic's
revisions (current and reference), including a critique whose x1 does not fit."""
import pytest
import torch

from rltf_ray import losses
from rltf_ray.config import BinacConfig, ConfigError
from rltf_ray.loading import load_config
from rltf_ray.metrics import critic_metrics
from rltf_ray.critic_examples import build_critic_examples, critic_rewards
from rltf_ray.examples import build_examples
from rltf_ray.stages.critique import critic_scores

from test_objectives import cfg, rows


def test_bilevel_reward_contrasts_the_current_and_the_reference_actor():
    b = BinacConfig(bilevel_lambda=1.0)
    # K = 2 critiques x M = 2 revisions of a wrong attempt (r0 = 0); the current actor fixes
    # with critique 0 twice and critique 1 once, the reference with critique 0 twice, never with 1
    got = critic_rewards(0.0, False, [1.0, 1.0, 1.0, 0.0], [False, False], [True, True], b,
                         reference_rewards=[1.0, 1.0, 0.0, 0.0])
    assert got == pytest.approx([2 * 1.0 - 1.0, 2 * 0.5 - 0.0])  # (1+l) u - l u_ref: c1 now ranks first
    assert critic_rewards(0.0, False, [1.0, 1.0, 1.0, 0.0], [False, False], [True, True],
                          BinacConfig(bilevel_lambda=0.0), [1.0, 1.0, 0.0, 0.0]) == pytest.approx([1.0, 0.5])
    lam = BinacConfig(bilevel_lambda=0.5, critic_reward="improvement")
    # improvement subtracts r0 = 0.2 from both terms: 1.5 (0.8) - 0.5 (0.3) = 1.05
    assert critic_rewards(0.2, False, [1.0], [False], [True], lam, [0.5]) == pytest.approx([1.05])


def test_a_group_without_any_verdict_line_is_not_flattened_by_the_format_penalty():
    b = BinacConfig()  # format_penalty -1
    assert critic_rewards(0.0, False, [1.0, 0.0], [None, None], [False, False], b) == pytest.approx([1.0, 0.0])
    assert critic_rewards(0.0, False, [1.0, 0.0], [None, False], [False, True], b) == pytest.approx([-1.0, 0.0])
    row = {"prompt_id": "p", "reward_first": 0.0, "correct_first": False, "critic_prompt_ids": [1],
           "critic_critiques": ["a", "b"], "critic_critique_ids": [[7], [8]],
           "critic_critique_logprobs": [[-1.0], [-1.0]], "critic_verdicts": [None, None],
           "critic_format_ok": [False, False], "critic_revision_rewards": [1.0, 0.0],
           "critic_revision_correct": [True, False], "critic_revisions": ["x", "y"], "critic_version": 0}
    from rltf_ray.config import Config

    ex, _ = build_critic_examples([row], Config(binac=b))
    assert [e.adv for e in ex] == pytest.approx([0.5, -0.5])  # a gradient, where -1 and -1 gave none
    m = critic_metrics([row, {**row, "critic_format_ok": [True, False]}], b)
    assert m["critic_format_waived_groups"] == 1 and m["critic_fix_rate"] == pytest.approx(0.5)
    assert m["critic_reward_reference_mean"] is None and m["critic_revisions_overflowed"] == 0


def test_improvement_does_not_rank_a_harmful_critique_of_a_correct_answer_as_outcome_does():
    """What docs/objectives.md says: with critique_correct, r0 = 1 and r1 = -0.1 give -1.1
    under improvement, below the -1 of a critique without a verdict line."""
    b = BinacConfig(critique_correct=True)
    harmful, unformatted = critic_rewards(1.0, True, [-0.1, 1.0], [True, None], [True, False], b)
    assert harmful == pytest.approx(-1.1) and unformatted == -1.0 and harmful < unformatted
    assert critic_rewards(1.0, True, [-0.1, 1.0], [True, None], [True, False],
                          BinacConfig(critique_correct=True, critic_reward="outcome")) == pytest.approx([-0.1, -1.0])


def test_critic_metrics_report_the_reference_term_and_the_fix_rate():
    b = BinacConfig(bilevel_lambda=1.0)
    row = {"reward_first": 0.0, "correct_first": False, "critic_critiques": ["a", "b"],
           "critic_critique_ids": [[1, 2], [3]], "critic_verdicts": [False, False],
           "critic_format_ok": [True, True], "critic_revisions": ["x", None],
           "critic_revision_rewards": [1.0, 0.0], "critic_revision_correct": [True, None],
           "critic_reference_rewards": [0.0, 0.0], "critic_version": 3}
    m = critic_metrics([row], b)
    assert m["critic_reward_mean"] == pytest.approx((2.0 + 0.0) / 2)
    # the revision that could not be made (None) is no failed fix: 1 of 1
    assert m["critic_reward_reference_mean"] == 0.0 and m["critic_fix_rate"] == 1.0
    assert m["critic_revisions_overflowed"] == 1 and m["critic_version_rollout"] == 3


def test_a_revision_that_could_not_be_made_scores_as_the_attempt_it_revises():
    from rltf_ray.config import TaskConfig
    from rltf_ray.tasks import get_task

    task = get_task(TaskConfig(name="arithmetic"))
    row = {"meta": {"answer": 7}, "reward_first": 0.25, "correct_first": False,
           "critic_revisions": ["<answer>7</answer>", None], "critic_reference_revisions": [None, "8"]}
    [got] = critic_scores(task, [row])
    assert got["critic_revision_rewards"][1] == 0.25 and got["critic_revision_correct"] == [True, None]
    assert got["critic_revision_rewards"][0] == task.score("<answer>7</answer>", {"answer": 7}).reward
    assert got["critic_reference_rewards"][0] == 0.25


def test_final_returns_give_every_turn_the_last_attempts_reward():
    R = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    taken = torch.tensor([[True, False], [True, True], [True, True]])
    assert losses.final_returns(R, taken).tolist() == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]


def test_the_papers_actor_trains_its_first_turn_toward_the_final_reward(tiny_tokenizer):
    data = rows([1.0, 0.0, 0.0], [1.0, 1.0, 0.0])  # the first is correct and ends there
    ex = build_examples(data, cfg(first_turn_return="final", lambda_sd=0), tiny_tokenizer)[0]
    # R(x, y_last) = [1, 1, 0], centred: [1/3, 1/3, -2/3]; turn 1 (two rows): r1 [1, 0] centred
    assert [e.adv for e in ex if e.term == "rl0"] == pytest.approx([1 / 3, 1 / 3, -2 / 3])
    assert [e.adv for e in ex if e.term == "rl1"] == pytest.approx([0.5, -0.5])
    disc = build_examples(data, cfg(gamma=0.1, lambda_sd=0), tiny_tokenizer)[0]
    assert [e.adv for e in disc if e.term == "rl0"] != pytest.approx([1 / 3, 1 / 3, -2 / 3])


def test_alternating_schedule_never_trains_both_on_one_step():
    b = BinacConfig(schedule="alternate", actor_steps=3, critic_steps=1)
    assert [s for s in range(8) if b.actor_trains(s)] == [0, 1, 2, 4, 5, 6]
    assert [s for s in range(8) if b.critic_trains(s)] == [3, 7]
    frozen = BinacConfig(schedule="alternate", critic_steps=0)
    assert all(frozen.actor_trains(s) and not frozen.critic_trains(s) for s in range(12))


@pytest.mark.parametrize("override,match", [
    ("binac.bilevel_lambda=-0.5", "bilevel_lambda: must be >= 0"),
    ("binac.bilevel_lambda=.nan", "bilevel_lambda: must be >= 0"),
    ("binac.reference_every=0", "reference_every: .* must be >= 1"),
    ("binac.schedule=both", "binac.schedule: expected overlap or alternate"),
    ("loss.first_turn_return=sum", "loss.first_turn_return: expected one of discounted, final"),
])
def test_bad_bilevel_values_are_refused(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config("pipelines/configs/tiny.yaml", [override], preset="binac")


def test_the_binac_presets_are_what_their_names_say():
    def get(preset):
        return load_config("pipelines/configs/tiny.yaml", [], preset=preset)

    paper, ablation, sd, fixed = (get(p) for p in ("binac", "binac_no_bilevel", "binac_sd", "fixed_critic"))
    assert paper.binac.bilevel_lambda > 0 and paper.binac.schedule == "alternate"
    assert paper.loss.first_turn_return == "final" and paper.loss.lambda_sd == 0
    assert ablation.binac.bilevel_lambda == 0 and ablation.loss == paper.loss
    assert ablation.binac.schedule == paper.binac.schedule and ablation.binac.actor_steps == paper.binac.actor_steps
    assert sd.loss.lambda_sd == 0.1 and sd.binac.bilevel_lambda == 0
    assert fixed.loss == paper.loss and fixed.binac.critic_steps == 0
    with pytest.raises(ConfigError, match="binac_no_bilevel. fixes binac.bilevel_lambda"):
        load_config("pipelines/configs/tiny.yaml", ["binac.bilevel_lambda=1"], preset="binac_no_bilevel")


# -- on a real tiny vLLM engine ------------------------------------------------------------

@pytest.fixture(scope="module")
def reference_engine(tiny_path):
    import ray

    from rltf_ray.config import EngineConfig
    from rltf_ray.stages.engine import start_engines

    ray.init(num_cpus=4, include_dashboard=False)
    try:
        yield start_engines(tiny_path, EngineConfig(max_model_len=160), "float32", 0, reference_every=2)[0]
    finally:
        ray.shutdown()


def _greedy(engine, reference=False):
    import ray

    out = ray.get(engine.generate.remote([[1, 5, 9, 13, 17]], n=1, temperature=0.0, top_p=1.0,
                                         max_tokens=8, reference=reference))
    g = out["outputs"][0][0]
    return tuple(g.token_ids), out["version"]


@pytest.mark.integration
def test_the_engine_serves_the_reference_actor_and_refreshes_it_every_reference_every(reference_engine,
                                                                                     tiny_path):
    from safetensors.torch import load_file

    from rltf_ray.weight_sync.object_store import ObjectStoreSync

    base = load_file(f"{tiny_path}/model.safetensors")
    sync = ObjectStoreSync(torch.float32)
    sync.connect([reference_engine])
    gen = torch.Generator().manual_seed(0)

    def push(version):  # weights far from the base: greedy outputs tell them apart
        sync.push([(k, v + 0.5 * torch.randn(v.shape, generator=gen)) for k, v in base.items()], version)
        return _greedy(reference_engine)[0]

    out0 = _greedy(reference_engine)[0]
    out1 = push(1)
    assert out1 != out0
    assert _greedy(reference_engine, reference=True) == (out0, 0)  # version 0: the model on disk
    assert _greedy(reference_engine) == (out1, 1)  # and the current weights are back
    out2 = push(2)  # divisible by reference_every = 2: the reference becomes version 2
    assert _greedy(reference_engine, reference=True) == (out2, 2)
    out3 = push(3)
    assert out3 != out2
    assert _greedy(reference_engine, reference=True) == (out2, 2) and _greedy(reference_engine) == (out3, 3)
    # a trainer restored to an older checkpoint pushes an older version: the reference (v2)
    # would be newer than the actor, so it restarts from the restored weights
    back = push(1)
    assert _greedy(reference_engine, reference=True) == (back, 1)


def test_blocks_whose_empty_list_columns_were_typed_null_concatenate():
    import pyarrow as pa

    from rltf_ray.stages import concat_blocks

    none = pa.Table.from_pylist([{"critic_reference_revisions": [], "revision_ids": [3]}])
    some = pa.Table.from_pylist([{"critic_reference_revisions": ["y", None], "revision_ids": []}])
    with pytest.raises(pa.ArrowInvalid):
        pa.concat_tables([none, some])  # what the step did before
    got = concat_blocks([none, some])
    assert got.schema.field("critic_reference_revisions").type == pa.list_(pa.string())
    assert got.to_pylist() == [{"critic_reference_revisions": [], "revision_ids": [3]},
                               {"critic_reference_revisions": ["y", None], "revision_ids": []}]


@pytest.mark.integration
def test_critic_revisions_by_both_actors_and_an_x1_too_long_counts_instead_of_failing(reference_engine,
                                                                                       tiny_path):
    import ray
    from safetensors.torch import load_file

    from rltf_ray.chat import encode, load_tokenizer, revision_messages
    from rltf_ray.graph import ReviseParams
    from rltf_ray.stages.rollout import make_revise
    from rltf_ray.weight_sync.object_store import ObjectStoreSync

    # reference and current weights far apart: the smallest even version above the engine's
    # becomes the reference (a divisible version, or a jump, refreshes it), the next odd one
    # the current actor's
    base_w = load_file(f"{tiny_path}/model.safetensors")
    sync = ObjectStoreSync(torch.float32)
    sync.connect([reference_engine])
    gen = torch.Generator().manual_seed(7)
    v = ray.get(reference_engine.ready.remote())
    even = v + 1 + (v + 1) % 2
    for version in (even, even + 1):
        sync.push([(k, w + 0.5 * torch.randn(w.shape, generator=gen)) for k, w in base_w.items()], version)
    p = ReviseParams(max_tokens=8, template="Feedback: {critique}")
    revise = make_revise([reference_engine], tiny_path, p, "revision", 160, critic_revisions=2, bilevel=True)
    base = {"prompt_id": "p", "prompt": "2 + 2?", "response": "5", "gen_tokens": 1, "gen_seconds": 0.0}
    rows = [{**base, "critique": "short", "revised": True, "critic_critiques": ["short", "too long " * 80]},
            {**base, "critique": "", "revised": False, "critic_critiques": []}]
    out = revise(rows)
    first = out[0]
    assert len(first["critic_revisions"]) == 4 and first["critic_revisions"][2:] == [None, None]
    assert all(isinstance(t, str) for t in first["critic_revisions"][:2])  # both revisions of the short one
    assert first["critic_revisions"][0] == first["revision"]  # the actor's own revision, slot 0
    assert len(first["critic_reference_revisions"]) == 4 and first["critic_reference_revisions"][2:] == [None, None]
    assert all(isinstance(t, str) for t in first["critic_reference_revisions"][:2])
    assert out[1]["critic_revisions"] == [] and out[1]["critic_reference_revisions"] == []
    # greedy (one revision per critique): each actor's revisions are what its own weights
    # write from that x1
    greedy = ReviseParams(max_tokens=8, temperature=0.0, template=p.template)
    first = make_revise([reference_engine], tiny_path, greedy, "revision", 160, critic_revisions=1,
                        bilevel=True)(rows)[0]
    x1 = encode(load_tokenizer(tiny_path), revision_messages(base, [("5", "short")], p.template))
    by = {ref: ray.get(reference_engine.generate.remote([x1], 1, 0.0, 1.0, 8, reference=ref))
          for ref in (False, True)}
    assert by[True]["version"] == even and ray.get(reference_engine.ready.remote()) == even + 1
    assert first["critic_reference_revisions"] == [by[True]["outputs"][0][0].text, None]
    assert first["critic_revisions"] == [by[False]["outputs"][0][0].text, None]
    assert first["critic_reference_revisions"][0] != first["critic_revisions"][0]  # told apart
