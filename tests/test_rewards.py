"""Reward functions called as TRL and verl call them (rltf_ray/tasks/rewards.py): TRL's batch
call with completion_ids and trainer_state, None and all-None answers, required columns,
verl's ground truth, and correctness from one function (`task.correct_from`)."""
import json
import logging

import pytest

from rltf_ray.critics.programmatic import ProgrammaticCritic
from rltf_ray.errors import ConfigError
from rltf_ray.graph import CritiqueParams, SourceParams
from rltf_ray.loading import config_from_data
from rltf_ray.sources import PromptSource, read_prompt_file
from rltf_ray.stages.critique import score_texts
from rltf_ray.stages.engine import GenOut
from rltf_ray.tasks import get_task
from rltf_ray.tasks.rewards import RewardFunctionError, TrainerState

REWARDS = '''
CALLS = []
VERL = []

def accuracy(prompts, completions, solution, **kwargs):
    CALLS.append(("accuracy", len(completions), sorted(kwargs), solution))
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [None if s is None else float(t.strip() == s) for t, s in zip(texts, solution)]

def ids_and_step(completions, completion_ids, trainer_state, kind, **kwargs):
    CALLS.append(("ids_and_step", len(completions), completion_ids, trainer_state, kind))
    return [None if k != "math" else len(ids) + trainer_state.global_step / 10 for ids, k in zip(completion_ids, kind)]

def format_reward(completions, **kwargs):
    return [1.0 if "<answer>" in c else 0.0 for c in completions]

def names_only(completions, solution):
    CALLS.append(("names_only", solution))
    return [0.0 for _ in completions]

def needs_difficulty(completions, difficulty, **kwargs):
    return [0.0 for _ in completions]

def raises_on_other(completions, kind, **kwargs):
    if "other" in kind:
        raise KeyError("other")
    return [1.0 for _ in completions]

def text_on_second(completions, **kwargs):
    return [1.0, "1", 1.0, 1.0][:len(completions)]

def too_few(completions, **kwargs):
    return [1.0]

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    VERL.append({"data_source": data_source, "ground_truth": ground_truth, "extra_info": extra_info})
    return {"score": float(solution_str.strip() == ground_truth)}

def verl_with_more(data_source, solution_str, ground_truth, extra_info, tokenizer):
    return 0.0
'''

ROWS = [{"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "solution": "5", "kind": "math"},
        {"prompt": "What is 4 + 4?", "solution": "8", "kind": "other"},
        {"prompt": "What is 1 + 1?", "kind": "math"},  # no solution: accuracy returns None
        {"prompt": "Write a haiku.", "kind": "other"}]  # every function returns None
TEXTS = ["5", "8", "2", "An old pond"]
IDS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("rewards")  # one folder: a plugin module is imported once per process
    (tmp_path / "batch_rewards.py").write_text(REWARDS)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path


def task_of(user_dir, *funcs, **task):
    refs = [f"{user_dir}/batch_rewards.py:{f}" for f in funcs]
    return get_task(config_from_data({"task": {"reward_funcs": refs, **task}}).task)


@pytest.fixture
def calls(user_dir):
    task_of(user_dir, "accuracy")  # the plugin is imported
    import batch_rewards

    batch_rewards.CALLS.clear()
    batch_rewards.VERL.clear()
    return batch_rewards


def file_rows(user_dir, task) -> list[dict]:
    return read_prompt_file(str(user_dir / "rows.jsonl"), task).rows


def test_trl_functions_are_called_once_per_batch_with_ids_and_the_step(user_dir, calls, caplog):
    task = task_of(user_dir, "accuracy", "ids_and_step", reward_weights=[1.0, 0.5])
    rows = [{**r, "response_ids": ids} for r, ids in zip(file_rows(user_dir, task), IDS)]
    # a column that some rows lack is None in them, as in a Hugging Face dataset
    assert json.loads(rows[2]["meta"]) == {"_prompt": "What is 1 + 1?", "kind": "math", "solution": None}
    with caplog.at_level(logging.WARNING, logger="rltf_ray.tasks.rewards"):
        got = score_texts(task, CritiqueParams(), rows, TEXTS, [0, 1, 2, 3], IDS, 3)  # the critique stage's call
    # accuracy: 1, 1, None, None; ids_and_step: len(ids) + step / 10 on the math rows, else None
    assert [got[i][0] for i in range(4)] == [(1.0 + 0.5 * 3.3, True, True), (1.0, True, True),
                                             (0.5 * 1.3, False, True), (0.0, False, True)]
    assert calls.CALLS == [
        ("accuracy", 4, ["completion_ids", "kind", "trainer_state"], ["5", "8", None, None]),
        ("ids_and_step", 4, IDS, TrainerState(global_step=3), ["math", "other", "math", "other"])]
    # the answer no function scored: 0, and one warning for the batch naming the functions
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("reward functions batch_rewards:accuracy, batch_rewards:ids_and_step all "
                              "returned None for 1 of 4 answers (the first is the row with prompt 'Write a haiku.')")


def test_the_programmatic_critic_scores_a_batch_of_requests_in_one_call(user_dir, calls):
    task = task_of(user_dir, "ids_and_step")
    items = [{"prompt": r["prompt"], "response": t, "meta": json.loads(r["meta"]), "response_ids": ids,
              "global_step": 7} for r, t, ids in zip(file_rows(user_dir, task), TEXTS, IDS)]
    out = ProgrammaticCritic(task).judge(items)
    assert [r["reward"] for r in out] == [3.7, 0.0, 1.7, 0.0]
    assert [r["correct"] for r in out] == [True, False, True, False]  # its value reaches correct_threshold
    assert out[1]["critique"] == "Your answer is incorrect." and out[2]["critique"] == "Your answer is correct."
    assert len(calls.CALLS) == 1 and calls.CALLS[0][3] == TrainerState(7)
    # one answer alone, with neither ids nor a step (a plugin critic's task.score): said, not guessed
    with pytest.raises(RewardFunctionError, match="requires completion_ids, trainer_state, which this call "
                                                  "does not have"):
        task.score("5", items[0]["meta"])


def test_a_function_without_kwargs_gets_only_what_it_names(user_dir, calls):
    task = task_of(user_dir, "names_only")
    rows = file_rows(user_dir, task)
    task.score_batch(TEXTS[:2], [json.loads(r["meta"]) for r in rows[:2]], IDS[:2], 0)
    assert calls.CALLS == [("names_only", ["5", "8"])]


@pytest.mark.parametrize("func, said", [
    # the function raised on the batch: each answer alone finds the row
    ("raises_on_other", r"raises_on_other on the row with prompt 'What is 4 \+ 4\?' raised KeyError"),
    ("text_on_second", r"text_on_second on the row with prompt 'What is 4 \+ 4\?' returned '1'; a reward is"),
    ("too_few", r"too_few on a batch of 4 answers \(the first is the row with prompt .*What is 2 \+ 3.*\) "
                r"returned 1 values for 4 completions"),
])
def test_a_batched_call_that_breaks_names_the_function_and_the_row(user_dir, func, said):
    task = task_of(user_dir, func)
    metas = [json.loads(r["meta"]) for r in file_rows(user_dir, task)]
    with pytest.raises(RewardFunctionError, match=said):
        task.score_batch(TEXTS, metas, IDS, 0)


def test_a_required_parameter_no_column_supplies_fails_when_the_file_is_read(user_dir):
    task = task_of(user_dir, "accuracy", "needs_difficulty")
    with pytest.raises(ConfigError, match=r"pipeline.prompts.path: reward function batch_rewards:needs_difficulty "
                                          r"requires 'difficulty', which no column of the file supplies "
                                          r"\(columns: kind, solution\)"):
        PromptSource(task, SourceParams(path=str(user_dir / "rows.jsonl")), 1)
    with pytest.raises(ConfigError, match="'difficulty'"):  # held-out rows are read the same way
        read_prompt_file(str(user_dir / "rows.jsonl"), task, key="eval.path")
    # verl passes its four arguments and nothing else: known at config time
    with pytest.raises(ConfigError, match=r"verl_with_more' requires tokenizer, which verl's compute_score is never"):
        task_of(user_dir, "verl_with_more")


def test_verl_reads_the_ground_truth_from_reward_model_first_and_extra_info_defaults_to_empty(tmp_path, user_dir,
                                                                                              calls):
    base = {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "2 + 3?"}]}
    rows = [{**base, "reward_model": {"style": "rule", "ground_truth": "5"}, "ground_truth": "7"},
            {**base, "ground_truth": "7", "extra_info": {"index": 3}},
            {**base, "reward_model": {"style": "rule"}}]
    (tmp_path / "verl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = task_of(user_dir, "compute_score")
    got = read_prompt_file(str(tmp_path / "verl.jsonl"), task)
    assert [b["reason"] for b in got.bad] == ["meta: a verl compute_score needs a ground truth: its reward_model "
                                              "has no 'ground_truth'"]
    scores = task.score_batch(["5", "5"], [json.loads(r["meta"]) for r in got.rows], [[1], [2]], 0)
    assert [s.reward for s in scores] == [1.0, 0.0]
    assert calls.VERL == [{"data_source": "gsm8k", "ground_truth": "5", "extra_info": {}},
                          {"data_source": "gsm8k", "ground_truth": "7", "extra_info": {"index": 3}}]


def test_correct_from_decides_correctness_not_the_sum(user_dir):
    plain = json.loads(file_rows(user_dir, task_of(user_dir, "accuracy"))[1]["meta"])  # What is 4 + 4?
    wrong_in_format, right = "<answer>6</answer>", "8"
    pair = task_of(user_dir, "accuracy", "format_reward")  # the first listed decides by default
    assert [(s.reward, s.correct) for s in pair.score_batch([wrong_in_format, right], [plain] * 2, [[1], [2]], 0)] \
        == [(1.0, False), (1.0, True)]
    by_name = task_of(user_dir, "accuracy", "format_reward", correct_from="format_reward")
    assert by_name.score_batch([wrong_in_format], [plain], [[1]], 0)[0].correct
    listed = task_of(user_dir, "accuracy", "format_reward", correct_from="batch_rewards:accuracy")
    assert not listed.score_batch([wrong_in_format], [plain], [[1]], 0)[0].correct
    # as written in task.reward_funcs, a file path, which becomes the plugin module's name
    written = task_of(user_dir, "accuracy", "format_reward", correct_from=f"{user_dir}/batch_rewards.py:format_reward")
    assert written.cfg.correct_from == "batch_rewards:format_reward"
    strict = task_of(user_dir, "format_reward", correct_threshold=1.5)
    assert not strict.score_batch([wrong_in_format], [plain], [[1]], 0)[0].correct
    with pytest.raises(ConfigError, match=r"task.correct_from: 'acc' is not one of task.reward_funcs "
                                          r"\(choices: accuracy, format_reward"):
        task_of(user_dir, "accuracy", "format_reward", correct_from="acc")
    with pytest.raises(ConfigError, match="task.correct_from: set without task.reward_funcs"):
        config_from_data({"task": {"correct_from": "accuracy"}})


def test_a_wrong_answer_in_the_right_format_is_critiqued_and_not_counted(user_dir):
    """TRL's usual accuracy + format pair: the wrong answer's sum reaches correct_threshold, yet
    it is wrong, so the feedback loop critiques it (as training does) and accuracy leaves it out."""
    from rltf_ray.evaluation import Evaluator

    task = task_of(user_dir, "accuracy", "format_reward")
    rows = file_rows(user_dir, task)[:2]

    def score(rows, answers, version):
        got = score_texts(task, CritiqueParams(), rows, [a.text for a in answers], list(range(len(rows))),
                          [a.token_ids for a in answers], version)
        return [got[i][0] for i in range(len(rows))]

    asked: list = []
    ev = Evaluator(engines=[], model_path="", task=task, score=score,
                   critique=lambda rows, answers, which, version: asked.append(list(which)) or {
                       i: ("Check the sum.", "") for i in which},
                   temperature=0.0, max_tokens=8, revision_template="{critique}")
    same = GenOut("<answer>9</answer>", [3], [0.0], "stop")
    ev._revise = lambda rows, exchanges, which: {i: same for i in which}
    first = [GenOut("5", [1], [0.0], "stop"), same]  # right; wrong in the right format
    assert [s[:2] for s in score(rows, first, 0)] == [(1.0, True), (1.0, False)]
    out = ev._feedback(rows, first, 1)
    assert asked == [[1]] and out["feedback_accuracy_1"] == 0.5
