import json
import random

import pytest

from rltf_ray.config import ConfigError, TaskConfig
from rltf_ray.tasks import get_task


def task(**kw):
    params = kw.pop("params", {"min_digits": 2, "max_digits": 4})
    return get_task(TaskConfig(params=params, **kw))


def test_generator_is_deterministic_per_seed_and_split():
    a, b = list(task().rows("train", 0, 20)), list(task().rows("train", 0, 20))
    assert a == b
    assert a != list(task(seed=1).rows("train", 0, 20))
    assert [r["prompt"] for r in a] != [r["prompt"] for r in task().rows("test", 0, 20)]


def test_verifier_accepts_truth_and_rejects_perturbation():
    t = task()
    for r in t.rows("train", 0, 50):
        meta = json.loads(r["meta"])
        ans = meta["answer"]
        assert t.score(f"so <answer>{ans}</answer>", meta).correct
        assert t.score(f"<answer>{ans}</answer>", meta).reward == 1.0
        assert not t.score(f"<answer>{ans + 1}</answer>", meta).correct
        # format shaping: correct number without the tag is not read in "tag" mode
        s = t.score(f"the answer is {ans}", meta)
        assert (s.correct, s.format_ok, s.reward) == (False, False, pytest.approx(-0.1))


def test_last_number_extraction():
    t = task(extraction="last_number")
    meta = {"a": 2, "b": 3, "op": "+", "answer": 5}
    s = t.score("2 + 3 = 5", meta)
    assert s.correct and not s.format_ok and s.reward == pytest.approx(0.9)
    assert t.score("first 5 then 6", meta).correct is False


def test_critique_locates_error_without_revealing_answer():
    t = task()
    rng = random.Random(0)
    for r in t.rows("train", 0, 200):
        meta = json.loads(r["meta"])
        ans = meta["answer"]
        wrong = ans + rng.choice([-1, 1]) * rng.randint(1, 500)
        c = t.critique(f"<answer>{wrong}</answer>", meta)
        if wrong != ans:
            assert "incorrect" in c and ("too high" in c) == (wrong > ans)
        if len(str(ans)) > 2:
            assert str(ans) not in c
    meta = {"a": 12, "b": 30, "op": "+", "answer": 42}
    assert "second digit" in t.critique("<answer>45</answer>", meta)
    assert "too many digits" in t.critique("<answer>420</answer>", meta)
    assert "could not be read" in t.critique("forty-two", meta)
    assert t.critique("<answer>42</answer>", meta) == "Your answer is correct."


def test_bad_task_params_are_named():
    with pytest.raises(ConfigError, match="unknown key 'digits'"):
        task(params={"digits": 3})
    with pytest.raises(ConfigError, match="ops"):
        task(params={"ops": ["-"]})
    with pytest.raises(ConfigError, match="unknown task 'nope'"):
        get_task(TaskConfig(name="nope"))
    with pytest.raises(ConfigError, match="extraction"):
        task(extraction="regex")


def test_math_task_boxed_extraction_and_verifier():
    t = get_task(TaskConfig(name="math"))
    rows = list(t.rows("train", 0, 40))
    assert rows == list(t.rows("train", 0, 40))
    for r in rows:
        meta = json.loads(r["meta"])
        assert t.score(f"so the answer is \\boxed{{{meta['answer']}}}", meta).correct
        assert not t.score("\\boxed{12345}", meta).correct
        c = t.critique("\\boxed{12345}", meta)
        # what is off, never the reference itself
        assert c.startswith("Your answer 12345 is incorrect.") and (len(meta["answer"]) <= 2 or meta["answer"] not in c)
    meta = {"question": "q", "answer": "\\frac{1}{2}"}
    assert t.score("\\boxed{0.5}", meta).correct and t.score("\\boxed{\\frac{2}{4}}", meta).correct
    assert t.extract("x \\boxed{\\frac{a}{b}} y") == ("\\frac{a}{b}", True)
    assert not t.score("the answer is 1/2", meta).format_ok
    test_rows = list(t.rows("test", 0, 10))
    assert {r["prompt"] for r in test_rows}.isdisjoint(r["prompt"] for r in t.rows("train", 0, 40))


def test_math_task_file_errors(tmp_path):
    bad = tmp_path / "m.jsonl"
    bad.write_text('{"problem": "1+1"}\n')
    with pytest.raises(ConfigError, match=":1: need 'problem'"):
        get_task(TaskConfig(name="math", params={"path": str(bad)}))


def test_math_verifier_works_off_the_main_thread():
    import threading

    t = get_task(TaskConfig(name="math"))
    meta = {"question": "q", "answer": "\\frac{1}{2}"}
    got = {}
    th = threading.Thread(target=lambda: got.update(ok=t.score("\\boxed{0.5}", meta).correct,
                                                   bad=t.score("\\boxed{2}", meta).correct))
    th.start()
    th.join(60)
    assert got == {"ok": True, "bad": False}


def test_held_out_rows_are_distinct_problems():
    small = task(params={"min_digits": 1, "max_digits": 1, "ops": ["+"]})  # 100 possible problems
    rows = small.held_out(150)
    assert 0 < len(rows) <= 100 and len({r["prompt"] for r in rows}) == len(rows)
    assert len(task().held_out(64)) == 64
    math_rows = get_task(TaskConfig(name="math")).held_out(64)
    assert len(math_rows) == 10 and len({r["prompt"] for r in math_rows}) == 10  # the holdout size


def test_answer_extraction_is_linear_and_takes_the_last_tag():
    import time

    from rltf_ray.tasks.base import last_tagged

    assert last_tagged("x <answer>1</answer> y <ANSWER> 2 </Answer>") == " 2 "
    assert last_tagged("<answer>a <answer>b</answer>") == "b" and last_tagged("<answer>open") is None
    assert last_tagged("</answer><answer>") is None
    t = task()
    hostile = ("<answer>" * 50_000, "</answer>" * 50_000, "<answer>1" * 30_000 + "</answer>")
    start = time.perf_counter()
    scores = [t.score(h, {"answer": 1}) for h in hostile]
    assert [(s.format_ok, s.correct) for s in scores] == [(False, False), (False, False), (True, True)]
    # a hang guard, not a timing: these take about 1 ms; a quadratic scan (an old regex took
    # 1.6 s on 40 KB) would take minutes on these 400 KB
    assert time.perf_counter() - start < 5.0


def test_convention_task_holds_out_pairs_and_never_gives_the_answer():
    from rltf_ray.config import TaskConfig
    from rltf_ray.errors import ConfigError as CE
    from rltf_ray.tasks import get_task
    from rltf_ray.tasks.convention import in_test_split

    t = get_task(TaskConfig(name="convention", extraction="last_number", format_weight=0.0,
                            params={"rule": "concat"}))
    train = [t.make_problem(i, "train") for i in range(3000)]
    test = [t.make_problem(i, "test") for i in range(300)]
    assert {(m["a"], m["b"]) for m in train}.isdisjoint({(m["a"], m["b"]) for m in test})
    assert all(in_test_split(m["a"], m["b"]) for m in test) and max(m["a"] for m in train) == 99
    m = {"a": 37, "b": 5, "op": "⊕", "rule": "concat", "answer": 375}
    assert t.prompt_text(m) == "What is 37 ⊕ 5? Give the final answer as <answer>number</answer>."
    assert t.score("So 375.", m).correct and not t.score("37 + 5 = 42", m).correct
    c = t.critique("37 + 5 = 42", m)
    assert c == ("Your answer is incorrect: it is too low. In this task a ⊕ b is not a sum: it means "
                 "writing the digits of a followed by the digits of b; for example, 2 ⊕ 5 = 25. "
                 "Compute 37 ⊕ 5 again with that rule.")
    for rule, want in (("swap", 537), ("repeat", 3737), ("offset", 52), ("double", 84)):
        got = get_task(TaskConfig(name="convention", params={"rule": rule})).make_problem(0, "test")
        from rltf_ray.tasks.convention import RULES

        assert RULES[rule][0](37, 5) == want and got["rule"] == rule
    for i in range(200):  # the critique never contains the answer, whatever the wrong answer was
        p = t.make_problem(i, "test")
        assert str(p["answer"]) not in t.critique("0", p)
    with pytest.raises(CE, match="task.params.rule: expected one of concat, swap"):
        get_task(TaskConfig(name="convention", params={"rule": "xor"}))


def test_a_task_that_can_score_nothing_is_refused_when_built():
    from rltf_ray.tasks.base import Task

    class Unscored(Task):  # neither check() nor score()
        name = "unscored"

    with pytest.raises(ConfigError, match=r"task unscored \(.*Unscored\): it can score nothing; implement "
                                          r"check\(answer, meta\) .* or score\(text, meta\)"):
        Unscored(TaskConfig(name="unscored"))

    class Checked(Task):
        name = "checked"

        def check(self, answer, meta):
            return answer == str(meta["answer"])

    assert Checked(TaskConfig(name="checked")).score("<answer>4</answer>", {"answer": 4}).correct

    class Judged(Task):  # no verifier: its rewards come from the critic, so it needs neither
        name = "judged"
        has_verifier = False

    Judged(TaskConfig(name="judged"))


def test_the_math_critique_says_what_is_off_in_the_final_answer():
    from rltf_ray.tasks import get_task as task_of

    math = task_of(TaskConfig(name="math", params={}))
    meta = {"question": "q", "answer": "12"}
    said = {text: math.critique(text, meta) for text in (
        "so \\boxed{12}", "\\boxed{-12}", "\\boxed{120}", "\\boxed{1.2}", "\\boxed{11.95}", "\\boxed{12.5}",
        "\\boxed{15}", "\\boxed{7}", "\\boxed{x+1}", "first \\boxed{12} then \\boxed{13}", "twelve")}
    assert said == {
        "so \\boxed{12}": "Your answer is correct.",
        "\\boxed{-12}": "Your answer -12 is incorrect. Check the sign.",
        "\\boxed{120}": "Your answer 120 is incorrect. It is off by a power of ten: check the units and the place value.",
        "\\boxed{1.2}": "Your answer 1.2 is incorrect. It is off by a power of ten: check the units and the place value.",
        "\\boxed{11.95}": "Your answer 11.95 is incorrect. It is close: do not round, and keep the exact value.",
        "\\boxed{12.5}": "Your answer 12.5 is incorrect. The answer is a whole number.",
        "\\boxed{15}": "Your answer 15 is incorrect. It is too large.",
        "\\boxed{7}": "Your answer 7 is incorrect. It is too small.",
        "\\boxed{x+1}": "Your answer x+1 is incorrect. Give the answer as a single number.",
        "first \\boxed{12} then \\boxed{13}": ("Your answer 13 is incorrect. You boxed 2 different answers; box "
                                              "exactly one. It is too large."),
        "twelve": "Your answer could not be read. Put your final answer inside \\boxed{}.",
    }
    # the critic's path (critique_scored) says the same from the score, without verifying again
    scores = {text: math.score(text, meta) for text in said}
    math.check = lambda answer, m: (_ for _ in ()).throw(AssertionError("verified twice"))
    assert {text: math.critique_scored(text, meta, scores[text]) for text in said} == said
    del math.check
    # not a finite number: no comparison, and no crash
    assert math.critique("\\boxed{inf}", meta) == "Your answer inf is incorrect. Give the answer as a single number."
    # a symbolic reference: no numeric hint, the verdict alone
    assert math.critique("\\boxed{x}", {"question": "q", "answer": "\\frac{\\pi}{2}"}) == "Your answer x is incorrect."
