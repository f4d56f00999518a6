"""docs/metrics.md is read by the integration runs' checks (`conftest.undocumented_keys`):
here, that the reader finds a section's keys, numbered keys included, and nothing else."""
from conftest import undocumented_keys


def test_documented_keys_pass_and_a_new_key_is_named():
    step = {"step": 0, "sampler_kl_k3": 1e-3, "turn_2_accuracy": 0.5, "revised_rows_3": 4}
    assert undocumented_keys(step, "metrics.jsonl") == []
    assert undocumented_keys({**step, "brand_new_metric": 1}, "metrics.jsonl") == ["brand_new_metric"]
    # a key documented in another section does not count for this one
    assert undocumented_keys({"greedy_accuracy": 1.0}, "metrics.jsonl") == ["greedy_accuracy"]
    evaluation = {"pass@4": 0.5, "pass@4_se": 0.1, "feedback_accuracy_2": 0.3, "greedy_accuracy": 0.2}
    assert undocumented_keys(evaluation, "Held-out evaluation") == []
    assert undocumented_keys({"curve": [], "variant": "fp32"}, "runs.jsonl") == []
