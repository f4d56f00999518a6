"""A failed run ends with one line that names the cause, however Ray wrapped it."""
import ray.exceptions

from rltf_ray.errors import cause_line
from rltf_ray.stages import StageError
from rltf_ray.tasks.rewards import RewardFunctionError


def raised(make):
    try:
        make()
    except Exception as e:  # noqa: BLE001
        return e


def test_the_reward_functions_error_is_named_through_rays_wrappers():
    def inner():
        try:
            raise ZeroDivisionError("division by zero")
        except ZeroDivisionError as z:
            raise RewardFunctionError("reward function my_rewards.acc on row 'p7' raised "
                                      "ZeroDivisionError: division by zero") from z

    original = raised(inner)
    # what Ray raises on the driver: RayTaskError(RewardFunctionError), a copy of the cause
    wrapped = ray.exceptions.RayTaskError("MapBatches(score)", "Traceback ...", original).as_instanceof_cause()

    def data_layer():  # Ray Data's own wrapper, with its advice on retries, raised from it
        raise RuntimeError("Failed to execute; consider max_errored_blocks") from wrapped

    assert cause_line(raised(data_layer)) == ("RewardFunctionError: reward function my_rewards.acc on row "
                                              "'p7' raised ZeroDivisionError: division by zero")


def test_a_stage_wrapping_a_function_names_the_function_and_plain_errors_the_innermost():
    def both():
        try:
            raise RewardFunctionError("reward function f on row 'a' returned 'x'")
        except RewardFunctionError as e:
            raise StageError("node 'score': failed") from e

    assert cause_line(raised(both)) == "RewardFunctionError: reward function f on row 'a' returned 'x'"

    def plain():
        try:
            {}["k"]
        except KeyError as e:
            raise RuntimeError("outer\nwith a second line") from e

    assert cause_line(raised(plain)) == "KeyError: 'k'"
    assert cause_line(ValueError("")) == "ValueError: (no message)"


def test_a_remote_error_whose_chain_was_lost_is_read_from_rays_traceback_text():
    """Across processes the original exception arrives pickled, without __cause__: Ray Data's
    UserCodeException is all that is left, and Ray's traceback text still names the cause."""
    class UserCodeException(Exception):
        pass

    tb = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
          "rltf_ray.tasks.rewards.RewardFunctionError: reward function rewards:broken on the row with "
          "prompt 'What is 1 + 1?' raised ZeroDivisionError: float division by zero\n\n"
          "The above exception was the direct cause of the following exception:\n\n"
          "ray.data.exceptions.UserCodeException: UDF failed to process a data block.")
    wrapped = ray.exceptions.RayTaskError("MapBatches(score)", tb, UserCodeException("UDF failed to process "
                                                                                       "a data block."))
    assert cause_line(wrapped.as_instanceof_cause()) == (
        "RewardFunctionError: reward function rewards:broken on the row with prompt 'What is 1 + 1?' raised "
        "ZeroDivisionError: float division by zero")


def test_an_error_raised_from_none_hides_its_context():
    def hidden():
        try:
            raise KeyError("inner")
        except KeyError:
            raise ValueError("outer") from None

    assert cause_line(raised(hidden)) == "ValueError: outer"
