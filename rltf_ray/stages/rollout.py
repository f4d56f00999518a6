"""First turn (generate) and revisions (revise, once per critique round): Ray Data batch
functions that send token-id prompts to the persistent engine actors."""
from __future__ import annotations

import ray

from rltf_ray.chat import encode, first_turn_messages, load_tokenizer, revision_messages
from rltf_ray.graph import GenerateParams, ReviseParams, round_col
from rltf_ray.rounds import dialogue
from rltf_ray.stages import StageError


def _call(engines: list, prompts: list[list[int]], node: str, **kw) -> dict:
    """Generate for `prompts`, split into contiguous shards over the engines (all at once);
    outputs come back in prompt order with the engine that served each, the lowest policy
    version that served, and the slowest shard's seconds."""
    n = len(engines)
    bounds = [len(prompts) * i // n for i in range(n + 1)]
    calls = [(i, range(bounds[i], bounds[i + 1])) for i in range(n) if bounds[i + 1] > bounds[i]]
    try:
        got = ray.get([engines[i].generate.remote([prompts[j] for j in idx], **kw) for i, idx in calls])
    except ray.exceptions.RayActorError as e:
        raise StageError(f"node '{node}': a vLLM engine actor died ({e}); see its log in the Ray "
                         "dashboard, and continue with `pipelines/run.py --resume`") from e
    outputs, engine_of, cached = [], [], []
    for (i, idx), res in zip(calls, got):
        outputs += res["outputs"]
        engine_of += [i] * len(idx)
        cached += res["cached"]
    return {"outputs": outputs, "engine": engine_of, "cached": cached,
            "version": min((r["version"] for r in got), default=-1),
            "seconds": max((r["seconds"] for r in got), default=0.0)}


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
        prompts = [encode(tok, first_turn_messages(r)) for r in rows]
        check_lengths(rows, prompts, p.max_tokens, max_model_len, node)
        res = _call(engines, prompts, node, n=p.n, temperature=p.temperature, top_p=p.top_p,
                    max_tokens=p.max_tokens)
        out = []
        for r, ids, group, eng in zip(rows, prompts, res["outputs"], res["engine"]):
            for j, g in enumerate(group):
                out.append({**r, "sample_idx": j, "prompt_ids": ids, "response": g.text, "engine": eng,
                            "response_ids": g.token_ids, "response_logprobs": g.logprobs,
                            "finish_reason": g.finish_reason, "policy_version": res["version"],
                            "gen_tokens": len(g.token_ids),
                            "gen_seconds": res["seconds"] / (len(rows) * len(group))})
        return out

    return generate


def make_revise(engines: list, model_path: str, p: ReviseParams, node: str, max_model_len: int,
                critic_revisions: int = 1, bilevel: bool = False):
    """Round k: one revision y_k from x_k = [x0, y0, c0, ..., y_{k-1}, c_{k-1}]. In round 1,
    a learned critic's K critiques each also get `critic_revisions` (M) revisions, which
    reward the critic; the actor's own revision fills the first slot of critique 0. With
    `bilevel`, the reference actor also makes M revisions from each critique."""
    k = p.round
    if p.template is None:
        raise ValueError("make_revise: the revision template is unresolved (give the task's own)")

    def col(name: str) -> str:
        return round_col(name, k)

    def revise(rows: list[dict]) -> list[dict]:
        tok = load_tokenizer(model_path)
        asked = [i for i, r in enumerate(rows) if r[col("revised")]]
        built = {i: encode(tok, revision_messages(rows[i], dialogue(rows[i], k), p.template))
                 for i in asked}
        # x_k grows with every critique; one that no longer fits ends its episode here
        # (context_overflow, counted), rather than failing the step or being cut silently
        overflow = {i for i in asked if len(built[i]) + p.max_tokens > max_model_len}
        todo = [i for i in asked if i not in overflow]
        prompts = [built[i] for i in todo]
        res = {"outputs": [], "version": -1, "seconds": 0.0, "cached": []}
        if todo:
            res = _call(engines, prompts, node, n=1, temperature=p.temperature,
                        top_p=p.top_p, max_tokens=p.max_tokens)
        done = {i: (ids, group[0]) for i, ids, group in zip(todo, prompts, res["outputs"])}
        cached = dict(zip(todo, res["cached"]))
        extra = for_critic(rows, done, tok) if k == 1 else ({}, {}, {}, 0.0)
        current, reference, extra_tokens, extra_s = extra
        out = []
        for i, r in enumerate(rows):
            ids, g = done.get(i, ([], None))
            out.append({**r, col("revised"): bool(r[col("revised")]) and i not in overflow,
                        col("context_overflow"): i in overflow,
                        col("revision_prompt_ids"): ids, col("revision"): g.text if g else "",
                        col("revision_ids"): g.token_ids if g else [],
                        col("revision_logprobs"): g.logprobs if g else [],
                        col("revision_version"): res["version"] if g else -1,
                        # x_k's prefix x0 + y0 (+ ...) was just computed: the prefill it saved
                        col("revision_cached_tokens"): cached.get(i, 0),
                        "gen_tokens": r["gen_tokens"] + (len(g.token_ids) if g else 0) + extra_tokens.get(i, 0),
                        "gen_seconds": r["gen_seconds"] + (res["seconds"] + extra_s) / max(len(rows), 1)})
            if k == 1:  # the texts, and their ids: reward functions get them as completion_ids
                for name, got in (("critic_revisions", current), ("critic_reference_revisions", reference)):
                    outs = got.get(i, [])
                    out[-1][name] = [None if g is None else g.text for g in outs]
                    out[-1][name.replace("revisions", "revision_ids")] = [None if g is None else g.token_ids
                                                                          for g in outs]
        return out

    def for_critic(rows: list[dict], done: dict, tok) -> tuple[dict, dict, dict, float]:
        """K x M revisions (critique-major) of each critiqued row by the current actor, and
        (bilevel) by the reference actor; {row: generated tokens}; seconds. A critique whose
        x1 does not fit gets None revisions (counted as the critic's context overflow)
        instead of failing the step. The revisions are the engine's outputs (text and ids)."""
        m = critic_revisions
        crit = {i: r["critic_critiques"] for i, r in enumerate(rows) if r.get("critic_critiques")}
        current = {i: [[] for _ in cs] for i, cs in crit.items()}
        reference = {i: [[] for _ in cs] for i, cs in crit.items()} if bilevel else {}
        x1 = {}
        for i, cs in crit.items():
            if i in done:  # the actor's own revision, from critique 0
                current[i][0].append(done[i][1])
            for kk, c in enumerate(cs):
                x1[i, kk] = encode(tok, revision_messages(rows[i], [(rows[i]["response"], c)], p.template))
        jobs: dict[tuple[bool, int], list] = {}  # (reference?, samples still needed) -> critiques
        for (i, kk), ids in x1.items():
            if len(ids) + p.max_tokens > max_model_len:
                current[i][kk] = [None] * m
                if bilevel:
                    reference[i][kk] = [None] * m
                continue
            if m > len(current[i][kk]):
                jobs.setdefault((False, m - len(current[i][kk])), []).append((i, kk))
            if bilevel:
                jobs.setdefault((True, m), []).append((i, kk))
        tokens: dict[int, int] = {}
        seconds = 0.0
        for (ref, need), keys in jobs.items():
            res = _call(engines, [x1[key] for key in keys], node, n=need, temperature=p.temperature,
                        top_p=p.top_p, max_tokens=p.max_tokens, **({"reference": True} if ref else {}))
            seconds += res["seconds"]
            for (i, kk), group in zip(keys, res["outputs"]):
                (reference if ref else current)[i][kk] += group
                tokens[i] = tokens.get(i, 0) + sum(len(g.token_ids) for g in group)

        def flat(outs: dict) -> dict:
            return {i: [g for per in v for g in per] for i, v in outs.items()}

        return flat(current), flat(reference), tokens, seconds

    return revise
