"""First turn (generate) and revisions (revise, once per critique round): Ray Data batch
functions that send token-id prompts to the persistent engine actors."""
from __future__ import annotations

import zlib

import ray

from rltf_ray.chat import encode, first_turn_messages, load_tokenizer, revision_messages
from rltf_ray.graph import GenerateParams, ReviseParams, round_col
from rltf_ray.rounds import dialogue
from rltf_ray.stages import StageError


def _pick(engines: list, key: str):
    return engines[zlib.crc32(key.encode()) % len(engines)]


def _call(engines: list, key: str, prompts: list[list[int]], node: str, **kw) -> dict:
    try:
        return ray.get(_pick(engines, key).generate.remote(prompts, **kw))
    except ray.exceptions.RayActorError as e:
        raise StageError(f"node '{node}': the vLLM engine actor died ({e}); see its log in the "
                         "Ray dashboard") from e


def check_lengths(rows: list[dict], prompts: list[list[int]], max_tokens: int,
                  max_model_len: int, node: str) -> None:
    """A prompt that cannot fit is a clear error, not a silently truncated or dropped row."""
    for r, ids in zip(rows, prompts):
        if len(ids) + max_tokens > max_model_len:
            raise StageError(f"node '{node}': prompt {r['prompt_id']} is {len(ids)} tokens; with "
                             f"max_tokens={max_tokens} it exceeds engine.max_model_len={max_model_len}")


def make_generate(engines: list, model_path: str, p: GenerateParams, node: str,
                  max_model_len: int):
    def generate(rows: list[dict]) -> list[dict]:
        tok = load_tokenizer(model_path)
        prompts = [encode(tok, first_turn_messages(r["prompt"])) for r in rows]
        check_lengths(rows, prompts, p.max_tokens, max_model_len, node)
        res = _call(engines, rows[0]["prompt_id"], prompts, node, n=p.n,
                    temperature=p.temperature, top_p=p.top_p, max_tokens=p.max_tokens)
        out = []
        for r, ids, group in zip(rows, prompts, res["outputs"]):
            for j, g in enumerate(group):
                out.append({**r, "sample_idx": j, "prompt_ids": ids, "response": g.text,
                            "response_ids": g.token_ids, "response_logprobs": g.logprobs,
                            "finish_reason": g.finish_reason, "policy_version": res["version"],
                            "gen_tokens": len(g.token_ids),
                            "gen_seconds": res["seconds"] / (len(rows) * len(group))})
        return out

    return generate


def make_revise(engines: list, model_path: str, p: ReviseParams, node: str, max_model_len: int):
    """Round k: one revision y_k from x_k = [x0, y0, c0, ..., y_{k-1}, c_{k-1}]."""
    k = p.round

    def col(name: str) -> str:
        return round_col(name, k)

    def revise(rows: list[dict]) -> list[dict]:
        tok = load_tokenizer(model_path)
        todo = [i for i, r in enumerate(rows) if r[col("revised")]]
        prompts = [encode(tok, revision_messages(rows[i]["prompt"], dialogue(rows[i], k), p.template))
                   for i in todo]
        check_lengths([rows[i] for i in todo], prompts, p.max_tokens, max_model_len, node)
        res = {"outputs": [], "version": -1, "seconds": 0.0}
        if todo:
            key = rows[todo[0]]["prompt_id"]
            res = _call(engines, key, prompts, node, n=1, temperature=p.temperature,
                        top_p=p.top_p, max_tokens=p.max_tokens)
        done = {i: (ids, group[0]) for i, ids, group in zip(todo, prompts, res["outputs"])}
        out = []
        for i, r in enumerate(rows):
            ids, g = done.get(i, ([], None))
            out.append({**r, col("revision_prompt_ids"): ids, col("revision"): g.text if g else "",
                        col("revision_ids"): g.token_ids if g else [],
                        col("revision_logprobs"): g.logprobs if g else [],
                        col("revision_version"): res["version"] if g else -1,
                        "gen_tokens": r["gen_tokens"] + (len(g.token_ids) if g else 0),
                        "gen_seconds": r["gen_seconds"] + res["seconds"] / max(len(rows), 1)})
        return out

    return revise
