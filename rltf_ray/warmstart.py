"""A short supervised warm start, so that a small model can learn from feedback at all.

RLTF-SD distils revisions into the first turn; it needs revisions that are better than
first attempts. A 135M model mostly parrots the critique, so before RL it gets a small
dose of supervised data (`rltf-ray warmstart`):

* format demonstrations: x0 -> a correct solution the task writes (`Task.demonstration`);
* revision demonstrations: [x0, y0, c0] -> a correct solution, where y0 is the model's own
  wrong answer (sampled by a vLLM engine) and c0 the task's programmatic critique of it.

Both are trained as plain cross-entropy on the target tokens (a full fine-tune with torch
AdamW), and the result is saved as an HF folder that the engines and the trainer load.
"""
from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch

from rltf_ray.chat import encode, first_turn_messages, load_tokenizer, pad_id, revision_messages


def demonstration(task, meta: dict) -> str:
    demo = task.demonstration(meta)
    if demo is None:
        raise ValueError(f"task {task.name}: a problem without a reference answer (meta.answer) gives no "
                         "warm-start demonstration")
    return demo


def format_demos(task, start: int, count: int) -> list[tuple[list[dict], str]]:
    """(conversation, target) pairs: the training problem's prompt and a correct solution."""
    out = []
    for row in task.rows("train", start, count):
        meta = json.loads(row["meta"])
        out.append((first_turn_messages(row), demonstration(task, meta)))
    return out


def wrong_attempts(engine, model_path: str, task, start: int, count: int, temperature: float,
                   max_tokens: int, samples: int = 2) -> tuple[list, dict]:
    """The model's own wrong first answers, (row, answer, meta), on training problems start..
    (sampled until `count` are found or the problems run out), and the accuracy it had."""
    import ray

    tok = load_tokenizer(model_path)
    out, seen, wrong = [], 0, 0
    i = start
    while len(out) < count and seen < count * 20:
        rows = list(task.rows("train", i, 32))
        i += 32
        prompts = [encode(tok, first_turn_messages(r)) for r in rows]
        res = ray.get(engine.generate.remote(prompts, n=samples, temperature=temperature, top_p=1.0,
                                             max_tokens=max_tokens))
        got = [(row, json.loads(row["meta"]), g) for row, group in zip(rows, res["outputs"]) for g in group]
        # one batch, with the engine's ids; no RL step yet, so no trainer_state
        scores = task.score_batch([g.text for _, _, g in got], [meta for _, meta, _ in got],
                                  [g.token_ids for _, _, g in got])
        for (row, meta, g), s in zip(got, scores):
            seen += 1
            if s.correct:
                continue
            wrong += 1  # every wrong answer counts, so that the accuracy below is the model's
            if len(out) < count:
                out.append((row, g.text, meta))
    return out, {"sampled": seen, "wrong": wrong, "first_turn_accuracy": 1 - wrong / max(seen, 1),
                 "next_problem": i}


def revision_demos(engines: list, model_path: str, task, template: str, start: int, count: int,
                   temperature: float, max_tokens: int, samples: int = 2) -> tuple[list, dict]:
    """(conversation, target) pairs built from the model's own wrong first answers on
    training problems start.. and the task's programmatic critique of each."""
    wrong, stats = wrong_attempts(engines[0], model_path, task, start, count, temperature, max_tokens, samples)
    stats.pop("next_problem")
    return [(revision_messages(row, [(text, task.critique(text, meta))], template),
             demonstration(task, meta)) for row, text, meta in wrong], stats


# Critiques that say an answer is wrong and nothing about why: the critic's warm start mixes
# them with the task's informative critique, so that a critic starts out helping some of the
# time and has something left to learn (docs/results.md, "Bi-NAC where the critic has room").
VAGUE_CRITIQUES = (
    "Your answer is incorrect. Check your work and try again.",
    "This is not right. Read the question again carefully.",
    "Your answer is wrong. Think about the problem once more.",
    "The result is incorrect. Go through your steps again.",
    "That answer does not match. Reconsider how you solved it.",
    "Incorrect. Look at the question again and give a new answer.",
)


def critic_demos(task, b, attempts: list, informative_share: float = 1.0,
                 seed: int = 0) -> list[tuple[list[dict], str]]:
    """The learned critic's warm start: for each wrong attempt, its conversation (as the
    critic sees it in a run) -> a critique ending with the verdict line. The critique is the
    task's programmatic one for a random `informative_share` of the attempts, else one of
    VAGUE_CRITIQUES (drawn with `seed`)."""
    from rltf_ray.critics.judges import VERDICT_LINES
    from rltf_ray.critics.learned import critic_messages

    if not 0.0 <= informative_share <= 1.0:
        raise ValueError(f"informative_share: a fraction in [0, 1], got {informative_share}")
    rng = random.Random(seed)
    out = []
    for row, text, meta in attempts:
        critique = (task.critique(text, meta) if rng.random() < informative_share
                    else rng.choice(VAGUE_CRITIQUES))
        out.append((critic_messages(b.prompt, row["prompt"], text, False if b.verdict_aware else None),
                    f"{critique}\n{VERDICT_LINES[1]}"))
    return out


def verdict_line_rate(engine, critic_path: str, b, attempts: list) -> dict:
    """How often the critic model writes the verdict line, over critiques of `attempts`
    sampled as a run samples them (binac.temperature, binac.max_tokens, K per attempt), and
    the share of an attempt's K critiques that are identical pairs (GRPO's group for the critic)."""
    import ray

    from rltf_ray.critics.judges import parse_verdict
    from rltf_ray.critics.learned import critic_messages
    from rltf_ray.metrics import identical_pair_fraction

    tok = load_tokenizer(critic_path)
    prompts = [encode(tok, critic_messages(b.prompt, row["prompt"], text, False if b.verdict_aware else None))
               for row, text, _ in attempts]
    res = ray.get(engine.generate.remote(prompts, n=b.critiques_per_attempt, temperature=b.temperature,
                                         top_p=1.0, max_tokens=b.max_tokens))
    texts = [g.text for group in res["outputs"] for g in group]
    verdicts = [parse_verdict(t) for t in texts]
    return {"critiques": len(texts), "temperature": b.temperature, "critiques_per_attempt": b.critiques_per_attempt,
            "identical_pair_fraction": identical_pair_fraction(
                [[g.token_ids for g in group] for group in res["outputs"]]),
            "verdict_line_rate": sum(v is not None for v in verdicts) / max(len(texts), 1),
            "says_incorrect": sum(v is False for v in verdicts) / max(len(texts), 1), "example": texts[0] if texts else ""}


def sft(model_path: str, pairs: list[tuple[list[dict], str]], out_dir: str, lr: float = 1e-5,
        epochs: int = 1, batch_size: int = 8, seed: int = 0) -> dict:
    """Cross-entropy on the target tokens of each (conversation, target) pair; saves the
    model and tokenizer to `out_dir`. Returns the mean loss of the first and last epoch."""
    from transformers import AutoModelForCausalLM

    from rltf_ray import losses

    torch.manual_seed(seed)
    tok = load_tokenizer(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    pad = pad_id(tok)
    examples = []
    for conv, target in pairs:
        x = encode(tok, conv)
        y = tok(target, add_special_tokens=False, split_special_tokens=True)["input_ids"] + [tok.eos_token_id]
        examples.append((x + y, len(x)))
    rng = random.Random(seed)
    history = []
    t0 = time.perf_counter()
    for _ in range(epochs):
        rng.shuffle(examples)
        total, count = 0.0, 0
        for k in range(0, len(examples), batch_size):
            batch = examples[k:k + batch_size]
            width = max(len(ids) for ids, _ in batch)
            ids = torch.full((len(batch), width), pad)
            attn = torch.zeros_like(ids)
            mask = torch.zeros(len(batch), width - 1)
            for i, (seq, start) in enumerate(batch):
                ids[i, :len(seq)] = torch.tensor(seq)
                attn[i, :len(seq)] = 1
                mask[i, start - 1:len(seq) - 1] = 1.0
            logp = losses.token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
            loss = losses.token_sum(-logp, mask, float(mask.sum()))
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            total += loss.item() * float(mask.sum())
            count += float(mask.sum())
        history.append(total / max(count, 1))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return {"examples": len(examples), "epochs": epochs, "loss_first_epoch": history[0],
            "loss_last_epoch": history[-1], "seconds": time.perf_counter() - t0,
            "finite": all(math.isfinite(h) for h in history)}
