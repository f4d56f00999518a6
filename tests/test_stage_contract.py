"""The column contract every pipeline stage runs under (`stages.arrow_stage`), and the rows-in-
flight count it keeps for the dashboard: back to 0 after a batch, whether the stage returned or
raised."""
import pyarrow as pa
import pytest

from rltf_ray.stages import ROWS, StageError, arrow_stage


def reward_rows(rows):
    return [{**r, "reward_second": 1.0, "correct_second": True, "format_second": True,
             "reward_asked": False, "reward_failed": False, "critic_revision_rewards": None, "critic_revision_correct": None,
             "critic_reference_rewards": None} for r in rows]


BATCH = pa.Table.from_pylist([{"step": 0, "revision": "<answer>7</answer>", "revision_ids": [1, 2], "revised": True,
                               "meta": "{}", "reward_first": 0.0}] * 3)


def test_a_stage_passes_its_rows_and_leaves_nothing_in_flight():
    out = arrow_stage("reward", "score_t1", reward_rows)(BATCH)
    assert out.num_rows == 3 and out.column("reward_second").to_pylist() == [1.0] * 3
    assert ROWS.in_flight[("", "score_t1")] == 0


def test_a_batch_without_a_declared_input_column_is_refused_by_name():
    with pytest.raises(StageError, match=r"node 'score_t2' \(reward\): input batch lacks columns \['reward_first'\]"):
        arrow_stage("reward", "score_t2", reward_rows)(BATCH.drop_columns(["reward_first"]))


def test_a_stage_that_skips_a_declared_output_is_refused_by_name():
    def forgets(rows):
        return [{k: v for k, v in r.items() if k != "reward_failed"} for r in reward_rows(rows)]

    with pytest.raises(StageError, match=r"did not write columns \['reward_failed'"):
        arrow_stage("reward", "score_t3", forgets)(BATCH)
    assert ROWS.in_flight[("", "score_t3")] == 0


def test_a_stage_that_raises_gives_its_rows_back():
    def fails(rows):
        raise ValueError("verifier down")

    with pytest.raises(ValueError, match="verifier down"):
        arrow_stage("reward", "score_t4", fails)(BATCH)
    assert ROWS.in_flight[("", "score_t4")] == 0


def test_rows_in_flight_are_counted_and_tagged_per_run(monkeypatch):
    """Two runs whose stages share a node name (and, on one cluster, a Ray Data worker) each
    see their own rows in flight, under their own `run` tag."""
    sets = []

    class Gauge:
        def set(self, value, tags):
            sets.append((tags, value))

    monkeypatch.setattr(ROWS, "gauge", Gauge())

    def peek(rows):  # while a's batch is inside the stage, b's runs through the same node
        arrow_stage("reward", "score_t5", reward_rows, run="b-222222")(BATCH.slice(0, 1))
        assert ROWS.in_flight[("a-111111", "score_t5")] == 3 and ROWS.in_flight[("b-222222", "score_t5")] == 0
        return reward_rows(rows)

    arrow_stage("reward", "score_t5", peek, run="a-111111")(BATCH)
    assert sets == [({"run": "a-111111", "stage": "score_t5"}, 3), ({"run": "b-222222", "stage": "score_t5"}, 1),
                    ({"run": "b-222222", "stage": "score_t5"}, 0), ({"run": "a-111111", "stage": "score_t5"}, 0)]
