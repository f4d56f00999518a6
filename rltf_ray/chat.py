"""Chat-template construction of the prompts RLTF uses: x0, x_k=[x0,y0,c0,...] and f_fm."""
from __future__ import annotations

import functools
import json


def revision_template(answer_format: str | None) -> str:
    """The user turn that carries a critique, asking for the task's answer format."""
    ask = f" Give your final answer as {answer_format}." if answer_format else ""
    return ("Here is feedback on your previous answer:\n{critique}\n\n"
            "Using this feedback, solve the problem again." + ask)


# The revision prompt of the tasks that answer in <answer> tags (the built-in ones but math).
DEFAULT_REVISION_TEMPLATE = revision_template("<answer>...</answer>")

FM_INSTRUCTION = ("You are given a question and your previous attempt below. "
                  "Your task is to provide a critique of the attempt.")


def first_turn_messages(row: dict) -> list[dict]:
    """x0: a prompt row's chat messages (its `messages` column: a chat prompt, or a system
    prompt before the question), else its `prompt` as one user turn."""
    if row.get("messages"):
        return json.loads(row["messages"])
    return [{"role": "user", "content": row["prompt"]}]


def fill_critique(template: str, critique: str) -> str:
    """The template with `{critique}` replaced, and nothing else read as a field: a task's
    template may hold braces of its own (math asks for `\\boxed{...}`)."""
    return template.replace("{critique}", critique)


def revision_messages(row: dict, exchanges: list[tuple[str, str]], template: str) -> list[dict]:
    """x_k = [x0, y0, c0, ..., y_{k-1}, c_{k-1}] from the (attempt, critique) exchanges."""
    msgs = first_turn_messages(row)
    for response, critique in exchanges:
        msgs += [{"role": "assistant", "content": response},
                 {"role": "user", "content": fill_critique(template, critique)}]
    return msgs


def fm_messages(prompt: str, response: str) -> list[dict]:
    text = (f"{FM_INSTRUCTION}\n\nQuestion:\n{prompt}\n\nPrevious attempt:\n{response}\n\n"
            "Critique:")
    return [{"role": "user", "content": text}]


def encode(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the conversation followed by the assistant generation prompt.

    Message content is always encoded as text: a special-token string inside a prompt, an
    answer or a critique (say `<|im_end|>\n<|im_start|>system`) stays plain text and can
    never forge a turn. The template is rendered with a placeholder per message; the text
    between placeholders (the template's own markup) is encoded with its control tokens, the
    content with `split_special_tokens=True`."""
    marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
    text = tokenizer.apply_chat_template([{**m, "content": k} for m, k in zip(messages, marks)],
                                         add_generation_prompt=True, tokenize=False)
    ids: list[int] = []
    pos = 0
    for m, k in zip(messages, marks):
        at = text.find(k, pos)
        if at < 0:
            raise ValueError("the tokenizer's chat template rewrites message content; rltf_ray cannot "
                             "encode content safely with it (see chat.encode)")
        ids += tokenizer.encode(text[pos:at], add_special_tokens=False)
        ids += tokenizer.encode(m["content"], add_special_tokens=False, split_special_tokens=True)
        pos = at + len(k)
    ids += tokenizer.encode(text[pos:], add_special_tokens=False)
    return [int(i) for i in ids]


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.chat_template is None:
        raise ValueError(f"tokenizer at {path} has no chat template; RLTF needs one to build x1")
    return tok


def pad_id(tokenizer) -> int:
    """The id that pads a batch of this tokenizer's sequences (its eos when it has no pad):
    each model pads with its own, since a critic's vocabulary may differ from the actor's."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
