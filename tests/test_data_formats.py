"""Prompt data as users have it: chat prompts, a system prompt, column mapping, Parquet and
dataset folders; reward functions in TRL's and verl's shapes (rltf_ray/tasks/rewards.py)."""
import json
import math

import pytest

from rltf_ray.chat import encode, first_turn_messages, revision_messages
from rltf_ray.config import TaskConfig
from rltf_ray.errors import ConfigError
from rltf_ray.graph import SourceParams
from rltf_ray.loading import config_from_data, load_config
from rltf_ray.sources import PromptSource, load_eval_rows, read_prompt_file
from rltf_ray.tasks import get_task
from rltf_ray.tasks.rewards import RewardFunctionError
from conftest import critic_plugin  # noqa: E402

REWARDS = '''
import asyncio
SEEN = []

def accuracy(prompts, completions, solution, **kwargs):
    SEEN.append({"prompts": prompts, "completions": completions, "solution": solution, **kwargs})
    text = completions[0][0]["content"] if isinstance(completions[0], list) else completions[0]
    return [1.0 if text.strip().endswith(str(solution[0])) else 0.0]

def brevity(completions, **kwargs):
    text = completions[0][0]["content"] if isinstance(completions[0], list) else completions[0]
    return [None if kwargs.get("kind", ["math"])[0] != "math" else 0.5 - len(text) / 100]

async def slow(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [0.25]

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str.strip() == ground_truth), "acc": True}

def raises(prompts, completions, **kwargs):
    raise KeyError("solution")

def two(prompts, completions, **kwargs):
    return [1.0, 0.0]

def text(prompts, completions, **kwargs):
    return ["1"]

def wrong_signature(x, y):
    return [1.0]
'''

CHAT = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("user")  # one folder: a plugin module is imported once per process
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    rows = [{"prompt": CHAT, "solution": "5", "kind": "math"},
            {"prompt": [{"role": "user", "content": "What is 4 + 4?"}], "solution": "8", "kind": "other"},
            {"prompt": "What is 1 + 1?", "solution": "2", "kind": "math"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def reward_task(user_dir, *funcs, **task):
    data = {"task": {"reward_funcs": [f"{user_dir}/my_rewards.py:{f}" for f in funcs], **task}}
    return config_from_data(data)


def test_chat_prompts_keep_their_messages_and_get_the_system_prompt(user_dir, tiny_tokenizer):
    cfg = reward_task(user_dir, "accuracy")
    task = get_task(cfg.task)
    params = SourceParams(path=str(user_dir / "rows.jsonl"), system_prompt="Be brief.", prompts_per_step=3)
    rows = PromptSource(task, params, 1).rows_for_step(0)
    assert [r["prompt"] for r in rows] == ["What is 2 + 3?", "What is 4 + 4?", "What is 1 + 1?"]
    x0 = [first_turn_messages(r) for r in rows]
    assert x0[0] == CHAT  # its own system message wins over system_prompt
    assert x0[1] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 4 + 4?"}]
    assert x0[2][0] == {"role": "system", "content": "Be brief."} and x0[2][1]["content"] == "What is 1 + 1?"
    # x1 starts with the whole of x0, system turn included
    x1 = revision_messages(rows[0], [("6", "too high")], "Feedback: {critique}")
    assert x1[:2] == CHAT and x1[2:] == [{"role": "assistant", "content": "6"},
                                         {"role": "user", "content": "Feedback: too high"}]
    text = tiny_tokenizer.decode(encode(tiny_tokenizer, x0[1]))
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 4 + 4?")
    # every other column is the meta, with the prompt as the file has it for the reward functions
    assert json.loads(rows[0]["meta"]) == {"_prompt": CHAT, "solution": "5", "kind": "math"}
    # a generator task's prompts get the system prompt too
    gen = PromptSource(get_task(TaskConfig()), SourceParams(system_prompt="Be brief.", prompts_per_step=1), 1)
    assert first_turn_messages(gen.rows_for_step(0)[0])[0] == {"role": "system", "content": "Be brief."}


def test_trl_functions_get_every_column_in_trl_shapes_and_weights_sum(user_dir):
    cfg = reward_task(user_dir, "accuracy", "brevity", "slow", reward_weights=[1.0, 2.0, 4.0])
    task = get_task(cfg.task)
    rows = read_prompt_file(str(user_dir / "rows.jsonl"), task).rows
    import my_rewards  # the plugin's module, as the config loaded it

    my_rewards.SEEN.clear()
    metas = [json.loads(r["meta"]) for r in rows]
    s = task.score("The answer is 5", metas[0])
    assert my_rewards.SEEN[0] == {"prompts": [CHAT], "completions": [[{"role": "assistant", "content": "The answer is 5"}]],
                                  "solution": ["5"], "kind": ["math"]}
    assert s.reward == pytest.approx(1.0 + 2.0 * (0.5 - 15 / 100) + 4.0 * 0.25) and s.correct
    # brevity returns None on the 'other' row: left out of the sum, as in TRL
    s = task.score("It is 9", metas[1])
    # the sum, 1.0, reaches correct_threshold, but correctness is the first function's alone: 0
    assert s.reward == pytest.approx(0.0 + 4.0 * 0.25) and not s.correct
    my_rewards.SEEN.clear()
    s = task.score("2", metas[2])  # a plain prompt: strings, as TRL passes them
    assert my_rewards.SEEN[0]["prompts"] == ["What is 1 + 1?"] and my_rewards.SEEN[0]["completions"] == ["2"]
    assert s.reward == pytest.approx(1.0 + 2.0 * 0.49 + 1.0)
    strict = get_task(reward_task(user_dir, "accuracy", correct_threshold=1.5).task)
    assert not strict.score("5", metas[0]).correct


def test_a_verl_compute_score_and_verl_rows_with_a_mapped_ground_truth(tmp_path, user_dir):
    row = {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "2 + 3?"}], "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"split": "train", "index": 0}}
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([row, {**row, "reward_model": {"style": "rule", "ground_truth": "7"}}]),
                   tmp_path / "train.parquet")
    task = get_task(reward_task(user_dir, "compute_score").task)
    rows = read_prompt_file(str(tmp_path / "train.parquet"), task).rows
    assert task.score("5", json.loads(rows[0]["meta"])).reward == 1.0
    assert task.score("5", json.loads(rows[1]["meta"])).reward == 0.0
    # a built-in task reads the same rows through a column mapping (a dotted path)
    math_task = get_task(TaskConfig(name="math"))
    params = SourceParams(meta_keys={"answer": "reward_model.ground_truth"})
    rows = read_prompt_file(str(tmp_path / "train.parquet"), math_task, params=params).rows
    assert json.loads(rows[0]["meta"]) == {"answer": "5"} and rows[0]["prompt"] == "2 + 3?"
    assert math_task.score("so \\boxed{5}", {"answer": "5"}).correct
    assert "\\boxed{...}" in math_task.revision_template  # the math task asks for its own format


def test_a_dataset_folder_and_a_missing_mapped_column(tmp_path, user_dir):
    import datasets

    task = get_task(reward_task(user_dir, "accuracy").task)
    ds = datasets.Dataset.from_list([{"question": f"{i} + 1?", "solution": str(i + 1)} for i in range(40)])
    ds.save_to_disk(str(tmp_path / "folder"), num_shards=3)  # several Arrow files, in order
    assert len(list((tmp_path / "folder").glob("*.arrow"))) > 1
    params = SourceParams(path=str(tmp_path / "folder"), prompt_key="question", prompts_per_step=2)
    rows = PromptSource(task, params, 1).file_rows
    assert [r["prompt"] for r in rows] == [f"{i} + 1?" for i in range(40)]
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(ConfigError, match=r"several splits \(train, test\); point it at one"):
        PromptSource(task, SourceParams(path=str(tmp_path / "dict")), 1)
    assert len(load_eval_rows(task, str(tmp_path / "dict" / "test"), 5, params)) == 5
    # a mapped column that a row lacks: that row, with its line, under the user's own key
    bad = SourceParams(path=str(user_dir / "rows.jsonl"), meta_keys=["solution", "difficulty"], prompts_per_step=1)
    with pytest.raises(ConfigError) as err:
        PromptSource(task, bad, 1, key="pipeline.my_prompts.path")
    msg = str(err.value)
    assert msg.startswith("pipeline.my_prompts.path: 3 bad row(s)") and "rows.jsonl:1 " in msg
    assert "missing column 'difficulty' (named in pipeline.my_prompts.meta_keys)" in msg
    assert "pipeline.my_prompts.on_bad_row=skip" in msg


@pytest.mark.parametrize("func, said", [
    ("raises", r"reward function my_rewards:raises on the row with prompt .*What is 1 \+ 1.* raised KeyError"),
    ("two", r"my_rewards:two .* returned 2 values for 1 completion"),
    ("text", r"my_rewards:text .* returned '1'; a reward is a finite number or None"),
])
def test_a_reward_function_that_breaks_is_named_with_its_row(user_dir, func, said):
    task = get_task(reward_task(user_dir, func).task)
    meta = json.loads(read_prompt_file(str(user_dir / "rows.jsonl"), task).rows[2]["meta"])
    with pytest.raises(RewardFunctionError, match=said):
        task.score("2", meta)


@pytest.mark.parametrize("refs, said", [
    (["nowhere:f"], "cannot import module 'nowhere'"),
    (["{d}/my_rewards.py:absent"], "module 'my_rewards' has no 'absent'"),
    (["{d}/my_rewards.py:wrong_signature"], r"takes \(x, y\); a reward function takes \(prompts, completions"),
    (["{d}/missing.py:f"], "file not found"),
    (["no_colon"], "expected 'module:function'"),
])
def test_a_bad_reward_function_reference_fails_at_config_time(user_dir, refs, said):
    with pytest.raises(ConfigError, match=said):
        config_from_data({"task": {"reward_funcs": [r.format(d=user_dir) for r in refs]}})


def test_reward_function_config_errors(user_dir):
    ref = f"{user_dir}/my_rewards.py:accuracy"
    with pytest.raises(ConfigError, match="task.name must be reward_funcs or left unset"):
        config_from_data({"task": {"name": "math", "reward_funcs": [ref]}})
    with pytest.raises(ConfigError, match="expected 2 numbers"):
        config_from_data({"task": {"reward_funcs": [ref, ref], "reward_weights": [1.0]}})
    with pytest.raises(ConfigError, match="has no problem generator"):
        PromptSource(get_task(reward_task(user_dir, "accuracy").task), SourceParams(), 1)
    assert math.isclose(reward_task(user_dir, "accuracy").task.correct_threshold, 1.0)


def test_reward_funcs_on_the_command_line_replace_a_config_files_task_and_its_params(user_dir):
    """The README's command: demo.yaml's arithmetic params do not follow it to the new task."""
    ref = f"task.reward_funcs=[{user_dir}/my_rewards.py:accuracy]"
    cfg = load_config("pipelines/configs/demo.yaml", [ref])
    assert cfg.task.name == "reward_funcs" and cfg.task.params == {}
    assert cfg.task.extraction == "last_number"  # the rest of the file's task section stays
    assert get_task(cfg.task).name == "reward_funcs"
    kept = load_config("pipelines/configs/demo.yaml", [ref, "task.params={}"]).task
    assert kept.params == {}
    with pytest.raises(ConfigError, match="unknown key 'max_digits' for reward_funcs"):
        get_task(load_config("pipelines/configs/demo.yaml", [ref, "task.params.max_digits=3"]).task)


def test_the_python_api_takes_functions(user_dir, monkeypatch):
    import rltf_ray

    monkeypatch.syspath_prepend(str(user_dir))
    import my_rewards

    cfg = rltf_ray.RLTFConfig.from_yaml("pipelines/configs/tiny.yaml").task(reward_funcs=[my_rewards.accuracy])
    cfg = cfg.node("prompts", path=str(user_dir / "rows.jsonl"), prompts_per_step=2)
    resolved = cfg.evaluation(path=str(user_dir / "rows.jsonl")).resolve()
    assert resolved.task.reward_funcs == ["my_rewards:accuracy"] and "my_rewards" in resolved.plugins
    # tiny.yaml's digits were its arithmetic task's; the reward-function task has none
    assert resolved.task.params == {} and get_task(resolved.task).name == "reward_funcs"
    # a function from a script or notebook (here a lambda) ships by value: a fresh process, as
    # a worker, gets it from the generated module the reference names
    lam = rltf_ray.RLTFConfig.from_yaml("pipelines/configs/tiny.yaml").task(
        reward_funcs=[lambda prompts, completions, **kw: [0.25 * len(c) for c in completions]])
    ref = lam.node("prompts", path=str(user_dir / "rows.jsonl")).evaluation(
        path=str(user_dir / "rows.jsonl")).resolve().task.reward_funcs[0]
    assert ref.startswith("rltf_main_") and ref.endswith(":fn")
    import subprocess
    import sys

    plugin = next(p for p in lam.resolve().plugins if "rltf_main_" in p)
    code = (f"from rltf_ray.plugins import load_plugin\nimport importlib\nload_plugin({plugin!r})\n"
            f"print(importlib.import_module({ref.split(':')[0]!r}).fn(['p'], ['ab', 'c']))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120).stdout.strip() == "[0.5, 0.25]"
    with pytest.raises(ConfigError, match="neither a function"):
        rltf_ray.RLTFConfig().task(reward_funcs=[3])


CRITIC = critic_plugin("hint_critic", "'The answer is ' + str(it['meta']['solution']) + '.'")


@pytest.mark.integration
def test_trl_rows_a_trl_reward_function_and_a_plugin_critic_train_from_outside_the_checkout(tmp_path):
    """A user's folder, not this checkout: chat-message prompts with a top-level `solution`,
    their reward function file and their critic plugin train one step through the console
    script; every first-turn reward in the rollouts is what their functions return, the second
    reading the engine's token ids and the step as TRL passes them. Every answer's sum reaches
    correct_threshold through the second; the first alone decides which are correct, and the
    wrong ones are critiqued."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pyarrow.parquet as pq

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "rewards.py").write_text(
        "def accuracy(prompts, completions, solution, **kwargs):\n"
        "    return [float(s in c[0]['content']) for c, s in zip(completions, solution)]\n\n"
        "def shape(completions, completion_ids, trainer_state, **kwargs):\n"
        "    return [1.0 + len(ids) / 1000 + trainer_state.global_step for ids in completion_ids]\n\n"
        "def sometimes(completions, **kwargs):  # None: no opinion on that answer, as in TRL\n"
        f"    with open({str(tmp_path / 'calls.txt')!r}, 'a') as f:\n"
        "        f.write(f'{len(completions)}\\n')\n"
        "    return [None if i % 2 else 0.0 for i in range(len(completions))]\n")
    (tmp_path / "critic.py").write_text(CRITIC)
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "solution": str(2 * i)} for i in range(6)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = (root / "pipelines" / "configs" / "tiny.yaml").read_text()
    yaml_text = base.replace("task: {name: arithmetic, extraction: tag, params: {min_digits: 1, max_digits: 2}}",
                             "task: {reward_funcs: ['rewards.py:accuracy', 'rewards.py:shape', 'rewards.py:sometimes'], "
                             "correct_threshold: 1.0}\n"
                             "plugins: [critic.py]")
    yaml_text = yaml_text.replace("eval: {prompts: 16}", "eval: {prompts: 4, path: train.jsonl}")
    yaml_text = yaml_text.replace("params: {prompts_per_step: 4}",
                                  "params: {prompts_per_step: 4, path: train.jsonl, system_prompt: Reply with a number.}")
    yaml_text = yaml_text.replace("{name: critic, kind: critique, inputs: {answers: first_turn}}",
                                  "{name: critic, kind: critique, inputs: {answers: first_turn}, params: {critic: hint_critic}}")
    assert yaml_text != base and "hint_critic" in yaml_text and "train.jsonl" in yaml_text
    (tmp_path / "run.yaml").write_text(yaml_text)
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.run([str(Path(sys.executable).parent / "rltf-ray"), "run", "--config", "run.yaml",
                           "run.steps=1", "run.eval_before_after=false", f"run.output_dir={tmp_path / 'out'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = pq.read_table(tmp_path / "out" / "rollouts" / "step_0.parquet").to_pylist()
    assert len(table) == 16
    sys.path.insert(0, str(tmp_path))
    try:
        import rewards
    finally:
        sys.path.remove(str(tmp_path))
    from rltf_ray.chat import load_tokenizer
    from rltf_ray.models import resolve_model

    tok = load_tokenizer(resolve_model("tiny"))
    for r in table:
        meta = json.loads(r["meta"])
        assert tok.decode(r["prompt_ids"]).startswith("<|im_start|>system\nReply with a number.<|im_end|>")
        want = rewards.accuracy([meta["_prompt"]], [[{"role": "assistant", "content": r["response"]}]], [meta["solution"]])[0]
        assert r["reward_first"] == pytest.approx(want + 1.0 + len(r["response_ids"]) / 1000)  # step 0
        assert r["correct_first"] == (want == 1.0) and r["critique_asked"] == (want < 1.0)
        if r["revised"]:  # the plugin critic's critique, in x1 after the whole of x0
            assert r["critique"] == f"The answer is {meta['solution']}."
            assert tok.decode(r["revision_prompt_ids"]).startswith(tok.decode(r["prompt_ids"])[:40])
    metrics = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0]
    # one call per batch, as TRL calls them: every first answer and revision scored once, and
    # the critiqued answers once more by the plugin critic (it scores with the task), in calls
    # of several
    calls = [int(x) for x in (tmp_path / "calls.txt").read_text().split()]
    asked, revised = sum(r["critique_asked"] for r in table), sum(r["revised"] for r in table)
    assert sum(calls) == len(table) + asked + revised and len(calls) < sum(calls) / 2
    assert metrics[0]["first_turn_accuracy"] == pytest.approx(sum(r["correct_first"] for r in table) / 16)


def test_a_run_that_evaluates_nothing_needs_no_held_out_file(user_dir):
    """TRL asks for no evaluation set: reward functions and a prompt file train without eval.path
    when the run evaluates nothing; a run that evaluates still must name its problems."""
    from rltf_ray.runner import Pipeline

    prompts = f"pipeline.prompts.path={user_dir / 'rows.jsonl'}"
    ref = f"task.reward_funcs=[{user_dir}/my_rewards.py:accuracy]"
    small = ["pipeline.prompts.prompts_per_step=3", "run.steps=1"]
    p = Pipeline(load_config("pipelines/configs/tiny.yaml", [ref, prompts, *small, "run.eval_before_after=false"]))
    assert p.held_out is None
    with pytest.raises(ConfigError, match="has no problem generator.*or evaluate nothing"):
        p.evaluate()
    with pytest.raises(ConfigError, match="has no problem generator"):
        Pipeline(load_config("pipelines/configs/tiny.yaml", [ref, prompts, *small]))


@pytest.mark.integration
def test_a_run_whose_reward_function_raises_ends_with_the_line_that_names_it(tmp_path):
    """The cause (function, row, exception) is the failed run's last line, not Ray Data's
    advice on retries with the cause in a traceback above it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "rewards.py").write_text("def broken(completions, solution, **kwargs):\n"
                                         "    return [1.0 / (len(s) - len(s)) for s in solution]\n")
    rows = [{"prompt": f"What is {i} + {i}?", "solution": str(2 * i)} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "rltf-ray"), "run", "--config", str(root / "pipelines/configs/tiny.yaml"),
         "task.name=reward_funcs", "task.params={}", "task.reward_funcs=[rewards.py:broken]",
         "pipeline.prompts.path=train.jsonl", "run.steps=1", "run.eval_before_after=false",
         "run.serve_http_port=8173", f"run.output_dir={tmp_path / 'out'}"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("run failed: RewardFunctionError: reward function rewards:broken on "), last
    assert "raised ZeroDivisionError: float division by zero" in last and "What is" in last
