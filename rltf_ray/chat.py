"""Chat-template construction of the prompts RLTF uses: x0, x_k=[x0,y0,c0,...] and f_fm."""
from __future__ import annotations

import functools

FM_INSTRUCTION = ("You are given a question and your previous attempt below. "
                  "Your task is to provide a critique of the attempt.")


def first_turn_messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def revision_messages(prompt: str, exchanges: list[tuple[str, str]], template: str) -> list[dict]:
    """x_k = [x0, y0, c0, ..., y_{k-1}, c_{k-1}] from the (attempt, critique) exchanges."""
    msgs = [{"role": "user", "content": prompt}]
    for response, critique in exchanges:
        msgs += [{"role": "assistant", "content": response},
                 {"role": "user", "content": template.format(critique=critique)}]
    return msgs


def fm_messages(prompt: str, response: str) -> list[dict]:
    text = (f"{FM_INSTRUCTION}\n\nQuestion:\n{prompt}\n\nPrevious attempt:\n{response}\n\n"
            "Critique:")
    return [{"role": "user", "content": text}]


def encode(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the conversation followed by the assistant generation prompt."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.chat_template is None:
        raise ValueError(f"tokenizer at {path} has no chat template; RLTF needs one to build x1")
    return tok
