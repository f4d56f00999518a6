"""The paper's reasoning puzzles (reasoning-gym generators and verifiers) with programmatic
critiques that say what is wrong without giving the solution, plus any other
reasoning-gym dataset by name (`task.name: rg:<dataset>`, generic critique)."""
from __future__ import annotations

import json
import re
from collections import deque

from rltf_ray.errors import ConfigError
from rltf_ray.tasks.base import Task, register_task

TRAIN_SIZE, TEST_SIZE = 19_800, 200  # 20,000 problems; the last 200 are held out

# The paper's settings, and an easier curriculum setting for small models.
PAPER = {
    "knights_knaves": {"n_people": 5, "depth_constraint": 3, "width_constraint": 3},
    "binary_matrix": {"min_n": 3, "max_n": 5, "p_zero": 0.25},
    "shortest_path": {"min_rows": 5, "max_rows": 6, "min_cols": 5, "max_cols": 6, "p_blocked": 0.4},
}
EASY = {
    "knights_knaves": {"n_people": 2, "depth_constraint": 2, "width_constraint": 2},
    "binary_matrix": {"min_n": 2, "max_n": 3, "p_zero": 0.4},
    "shortest_path": {"min_rows": 3, "max_rows": 4, "min_cols": 3, "max_cols": 4, "p_blocked": 0.2},
}
FORMAT = ("\n\nThink step by step, then give only your final answer inside "
          "<answer></answer>.")


class ReasoningGymTask(Task):
    """Extraction: the text inside <answer> tags ("tag"); with "last_number" an untagged
    answer is read from the last non-empty line, since these answers are not numbers."""

    dataset = ""
    meta_keys = ("question", "answer", "metadata")

    def __init__(self, cfg, dataset: str | None = None):
        super().__init__(cfg)
        try:
            import reasoning_gym
        except ImportError as e:
            raise ConfigError("reasoning-gym is not installed; run `make install`") from e
        self.dataset = dataset or self.dataset
        params = dict(cfg.params)
        level = params.pop("level", "paper")
        if level not in ("paper", "easy"):
            raise ConfigError(f"task.params.level: expected 'paper' or 'easy', got {level!r}")
        settings = {**(PAPER if level == "paper" else EASY).get(self.dataset, {}), **params}
        try:
            self.ds = reasoning_gym.create_dataset(self.dataset, size=TRAIN_SIZE + TEST_SIZE,
                                                   seed=cfg.seed, **settings)
        except (TypeError, ValueError, KeyError) as e:
            raise ConfigError(f"task {cfg.name}: reasoning-gym rejected {settings}: {e}") from None

    test_size, train_size = TEST_SIZE, TRAIN_SIZE

    def make_problem(self, index: int, split: str) -> dict:
        i = index % TRAIN_SIZE if split == "train" else TRAIN_SIZE + index % TEST_SIZE
        entry = self.ds[i]
        return json.loads(json.dumps({"question": entry["question"], "answer": entry["answer"],
                                      "metadata": entry["metadata"]}, default=str))

    def prompt_text(self, meta: dict) -> str:
        return meta["question"] + FORMAT

    def lenient_answer(self, text: str) -> str | None:
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else None

    def check(self, answer: str, meta: dict) -> bool:
        return float(self.ds.score_answer(answer, meta)) >= 1.0

    def critique(self, text: str, meta: dict) -> str:
        answer, _ = self.extract(text)
        if answer is None:
            return "Your answer could not be read. Put only your final answer inside <answer></answer>."
        if self.check(answer, meta):
            return "Your answer is correct."
        return "Your answer is incorrect. " + self.explain(answer, meta)

    def explain(self, answer: str, meta: dict) -> str:
        return "Check each step of your reasoning against the rules of the puzzle."


def _truth(expr, roles: list[bool]) -> bool:
    op = expr[0]
    if op == "telling-truth":
        return roles[expr[1]]
    if op == "lying":
        return not roles[expr[1]]
    if op == "not":
        return not _truth(expr[1], roles)
    if op == "and":
        return all(_truth(e, roles) for e in expr[1:])
    if op == "or":
        return any(_truth(e, roles) for e in expr[1:])
    if op == "->":
        return (not _truth(expr[1], roles)) or _truth(expr[2], roles)
    if op == "<=>":
        return _truth(expr[1], roles) == _truth(expr[2], roles)
    raise ValueError(f"unknown operator {op!r}")


@register_task("knights_knaves")
class KnightsKnaves(ReasoningGymTask):
    dataset = "knights_knaves"

    def explain(self, answer: str, meta: dict) -> str:
        md = meta["metadata"]
        names = md["names"]
        terms = md.get("knight_knave_terms") or {"knight": "knight", "knave": "knave"}
        good, bad_t = terms["knight"], terms["knave"]
        roles = []
        for name in names:
            m = re.search(rf"{re.escape(name)}\s+is\s+an?\s+({re.escape(good)}|{re.escape(bad_t)})",
                          answer, re.IGNORECASE)
            if not m:
                return (f"Your answer does not say whether {name} is a {good} or a {bad_t}. "
                        f"Give a role for every inhabitant, e.g. 'X is a {good}, Y is a {bad_t}'.")
            roles.append(m.group(1).lower() == good.lower())
        bad = [names[i] for i, st in enumerate(md["statements"]) if _truth(st, roles) != roles[i]]
        who = ", ".join(bad)
        return (f"Your assignment is inconsistent: under it, the statement made by {who} "
                f"contradicts that speaker's role (what a {good} says must be true, what a "
                f"{bad_t} says must be false). Revisit those statements.")


def _parse_matrix(text: str) -> list[list[int]] | None:
    rows = []
    for line in text.strip().splitlines():
        nums = re.findall(r"-?\d+", line)
        if nums:
            rows.append([int(x) for x in nums])
    return rows or None


@register_task("binary_matrix")
class BinaryMatrix(ReasoningGymTask):
    dataset = "binary_matrix"

    def explain(self, answer: str, meta: dict) -> str:
        want = meta["metadata"]["solution"]
        got = _parse_matrix(answer)
        n = len(want)
        if got is None or len(got) != n or any(len(r) != n for r in got):
            return (f"Your matrix has the wrong shape: give {n} rows of {n} numbers, one row per "
                    "line, separated by spaces.")
        wrong_rows = [i + 1 for i in range(n) if got[i] != want[i]]
        cells = sum(g != w for gr, wr in zip(got, want) for g, w in zip(gr, wr))
        rows = ", ".join(map(str, wrong_rows))
        return (f"{cells} cell{'s are' if cells != 1 else ' is'} wrong, in row"
                f"{'s' if len(wrong_rows) != 1 else ''} {rows}. Recompute the distance to the "
                "nearest 0 for those cells.")


MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def _bfs(grid, start, goal) -> int | None:
    q, seen = deque([(start, 0)]), {start}
    while q:
        (r, c), d = q.popleft()
        if (r, c) == goal:
            return d
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < len(grid) and 0 <= nc < len(grid[0]) and grid[nr][nc] != "X" \
                    and (nr, nc) not in seen:
                seen.add((nr, nc))
                q.append(((nr, nc), d + 1))
    return None


@register_task("shortest_path")
class ShortestPath(ReasoningGymTask):
    dataset = "shortest_path"

    def explain(self, answer: str, meta: dict) -> str:
        grid = meta["metadata"]["matrix"]
        find = lambda ch: next((r, c) for r, row in enumerate(grid) for c, v in enumerate(row) if v == ch)  # noqa: E731
        start, goal = find("*"), find("#")
        best = _bfs(grid, start, goal)
        words = answer.lower().split()
        if words == ["infeasible"]:
            return "A path from * to # does exist. Search again, moving only through open cells."
        if best is None:
            return "Check again whether any path from * to # exists at all."
        pos = start
        for k, w in enumerate(words, start=1):
            if w not in MOVES:
                return f"Step {k} ('{w}') is not a direction; use only up, down, left and right."
            pos = (pos[0] + MOVES[w][0], pos[1] + MOVES[w][1])
            if not (0 <= pos[0] < len(grid) and 0 <= pos[1] < len(grid[0])):
                return f"Your path is invalid: step {k} leaves the grid."
            if grid[pos[0]][pos[1]] == "X":
                return f"Your path is invalid: step {k} moves into a blocked cell (X)."
        if pos != goal:
            return "Your path stays inside open cells but does not end at the destination #."
        extra = len(words) - best
        return (f"Your path is valid but not shortest: it is {extra} step{'s' if extra != 1 else ''} "
                "longer than the optimum.")


def rg_task(cfg) -> Task:
    """`rg:<dataset>`: any reasoning-gym dataset with its own verifier, generic critique."""
    task = ReasoningGymTask(cfg, dataset=cfg.name.split(":", 1)[1])
    task.name = cfg.name
    return task
