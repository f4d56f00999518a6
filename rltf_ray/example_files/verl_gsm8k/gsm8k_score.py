"""A verl custom reward function in the style of verl's gsm8k scorer: the number after the last
"####" against the ground truth; 1.0 right, 0.1 a wrong number in the right format, 0 without
"####". verl calls it once per answer with these four arguments."""
import re

FINAL = re.compile(r"####\s*(-?[0-9.,]+)")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    found = FINAL.findall(solution_str)
    if not found:
        return 0.0
    answer = found[-1].replace(",", "").rstrip(".")
    return 1.0 if answer == str(ground_truth) else 0.1
