"""Reward functions exactly as TRL's GRPOTrainer calls them: one call per batch, `completions`
as chat messages (the prompts are conversational), every dataset column by name."""
import re

ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)
FORMAT = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def accuracy_reward(completions, solution, **kwargs):
    """1.0 when the number in <answer> equals the solution, else 0.0."""
    out = []
    for completion, sol in zip(completions, solution):
        found = ANSWER.findall(completion[0]["content"])
        out.append(float(bool(found) and found[-1].replace(",", "").strip() == sol))
    return out


def format_reward(completions, **kwargs):
    """0.5 for <think>...</think> then <answer>...</answer>, as TRL's format reward asks."""
    return [0.5 if FORMAT.match(c[0]["content"]) else 0.0 for c in completions]
