"""The declarative pipeline graph: node kinds, the Arrow columns each reads and writes,
their typed parameters, validation before anything starts, and drawing.
"""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rltf_ray.config import Config, ConfigError, NodeSpec, _build
from rltf_ray.nodes import (CritiqueParams, GenerateParams, ReviseParams, RewardParams,  # noqa: F401
                            SourceParams, TrainParams, check_round)  # (re-exported: the graph's params)

# The learned critic's (Bi-NAC) columns, round 1 only: its K critiques of the attempt, the
# K x M revisions made with them by the current actor (and, with the bilevel term, by the
# reference actor), and their rewards. Empty for the other critics.
CRITIC_CRITIQUE = ("critic_version", "critic_prompt_ids", "critic_critiques", "critic_critique_ids",
                   "critic_critique_logprobs", "critic_verdicts", "critic_format_ok", "critic_context_overflow")
CRITIC_REVISE = ("critic_revisions", "critic_reference_revisions", "critic_revision_ids",
                 "critic_reference_revision_ids")
CRITIC_REWARD = ("critic_revision_rewards", "critic_revision_correct", "critic_reference_rewards")
CRITIC_COLUMNS = CRITIC_CRITIQUE + CRITIC_REVISE + CRITIC_REWARD


@dataclass(frozen=True)
class NodeKind:
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    params: type
    description: str


KINDS: dict[str, NodeKind] = {
    "source": NodeKind((), ("step", "prompt_id", "prompt", "messages", "meta"), SourceParams,
                       "prompt rows for one RL step (file or task generator)"),
    "generate": NodeKind(("prompt", "messages"), ("sample_idx", "prompt_ids", "response", "response_ids",
                                       "response_logprobs", "policy_version", "engine"), GenerateParams,
                         "first turn: N vLLM samples per prompt"),
    "critique": NodeKind(("step", "prompt", "response", "response_ids", "meta"),
                         ("reward_first", "correct_first", "format_first", "critique",
                          "critique_asked", "critique_failed", "critique_error", "critic_disagrees", "revised",
                          *CRITIC_CRITIQUE), CritiqueParams,
                         "reward r0 and critique c0 from the Serve critic"),
    "revise": NodeKind(("prompt", "messages", "response", "critique", "revised"),
                       ("revision_prompt_ids", "revision", "revision_ids", "revision_logprobs",
                        "revision_cached_tokens", "revised", "context_overflow", *CRITIC_REVISE),
                       ReviseParams, "second turn: one revision y1 from x1=[x0,y0,c0]"),
    "reward": NodeKind(("step", "revision", "revision_ids", "revised", "meta", "reward_first"),
                       ("reward_second", "correct_second", "format_second", "reward_asked", "reward_failed",
                        *CRITIC_REWARD),
                       RewardParams, "score the revision (task verifier, or the critic's verdict)"),
    "train": NodeKind(("prompt_id", "prompt", "prompt_ids", "response", "response_ids",
                       "reward_first", "critique", "revision_ids", "reward_second"), (),
                      TrainParams, "Ray Train + DeepSpeed learner (GRPO + SD + FM)"),
}


def node_params(node: NodeSpec):
    """The node's typed parameters (defaults filled in); raises ConfigError naming the node."""
    return _build(KINDS[node.kind].params, node.params, f"pipeline node '{node.name}' params")


# -- critique rounds (`run.turns: K` = K-1 rounds of critique, revision and reward) ----------
ROUND_KINDS = ("critique", "revise", "reward")
FIRST_TURN_SCORE = ("reward_first", "correct_first", "format_first")
SECOND_TURN_SCORE = ("reward_second", "correct_second", "format_second")


def round_col(name: str, k: int) -> str:
    """Round 1 keeps the two-turn column names; round k >= 2 appends `_k` to them."""
    return name if k == 1 else f"{name}_{k}"


def node_round(node: NodeSpec) -> int:
    return int(node.params.get("round", 1)) if node.kind in ROUND_KINDS else 1


def columns(kind: str, k: int = 1) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(reads, writes) of a node of `kind` in critique round `k`."""
    spec = KINDS[kind]
    if k == 1 or kind not in ROUND_KINDS:
        return spec.reads, spec.writes
    writes = tuple(round_col(c, k) for c in spec.writes if c not in FIRST_TURN_SCORE + CRITIC_COLUMNS)
    earlier = [c for kd in ROUND_KINDS[:ROUND_KINDS.index(kind)] for c in columns(kd, k)[1]]
    previous = [round_col(c, k - 1) for c in ("revised", "revision", "revision_ids", "reward_second",
                                                 "correct_second")]
    return ("step", "prompt", "messages", "meta", *previous, *earlier), writes


def expand_rounds(cfg: Config) -> Config:
    """Clone the critique -> revise -> reward chain for rounds 2..turns-1, placed before the
    nodes that consumed round 1's reward node. A graph that already declares rounds is kept."""
    rounds = cfg.run.turns - 1
    if rounds <= 1 or any(node_round(n) > 1 for n in cfg.pipeline):
        return cfg
    chain = [cfg.node(kind) for kind in ROUND_KINDS]
    last, added = chain[-1].name, []
    prev = last
    for k in range(2, rounds + 1):
        for n in chain:
            port = next(iter(n.inputs), "rows")
            added.append(NodeSpec(f"{n.name}_{k}", n.kind, {port: prev}, {**n.params, "round": k}))
            prev = added[-1].name
    nodes = []
    for n in cfg.pipeline:
        nodes.append(dataclasses.replace(
            n, inputs={port: prev if src == last else src for port, src in n.inputs.items()}))
        if n.name == last:
            nodes.extend(added)
    return dataclasses.replace(cfg, pipeline=tuple(nodes))


def check_rounds(cfg: Config) -> None:
    rounds = cfg.run.rounds
    for kind in ROUND_KINDS:
        found = sorted(node_round(n) for n in cfg.pipeline if n.kind == kind)
        if found != list(range(1, rounds + 1)):
            raise ConfigError(f"pipeline: run.turns={cfg.run.turns} needs one '{kind}' node for "
                              f"each round 1..{rounds}, found rounds {found}")
    crit = {n.name: {k: v for k, v in n.params.items() if k != "round"}
            for n in cfg.pipeline if n.kind == "critique"}
    if len({repr(sorted(v.items())) for v in crit.values()}) > 1:
        raise ConfigError(f"pipeline: critique nodes {', '.join(crit)} must share one critic "
                          "(same params apart from round)")


def topo_order(nodes: tuple[NodeSpec, ...]) -> list[NodeSpec]:
    by_name = {n.name: n for n in nodes}
    order, state = [], {}

    def visit(n: NodeSpec, path: list[str]):
        if state.get(n.name) == "done":
            return
        if state.get(n.name) == "active":
            cycle = " -> ".join(path[path.index(n.name):] + [n.name])
            raise ConfigError(f"pipeline node '{n.name}': cycle {cycle}")
        state[n.name] = "active"
        for src in n.inputs.values():
            visit(by_name[src], path + [n.name])
        state[n.name] = "done"
        order.append(n)

    for n in nodes:
        visit(n, [])
    return order


def validate(cfg: Config) -> list[NodeSpec]:
    """Check the graph and every node's parameters; return nodes in execution order."""
    nodes = cfg.pipeline
    names = set()
    for n in nodes:
        if n.kind not in KINDS:
            raise ConfigError(f"pipeline node '{n.name}': unknown kind '{n.kind}' "
                              f"(known: {', '.join(KINDS)})")
        if n.name in names:
            raise ConfigError(f"pipeline node '{n.name}': duplicate name")
        names.add(n.name)
    for n in nodes:
        for port, src in n.inputs.items():
            if not isinstance(src, str) or src not in names:
                raise ConfigError(f"pipeline node '{n.name}': input '{port}' names unknown node {src!r}")
        node_params(n)
    order = topo_order(nodes)
    produced: dict[str, set[str]] = {}
    for n in order:
        have: set[str] = set()
        for src in n.inputs.values():
            have |= produced[src]
        reads, writes = columns(n.kind, node_round(n))
        for col in reads:
            if col not in have:
                raise ConfigError(f"pipeline node '{n.name}': needs column '{col}' but no upstream "
                                  f"node produces it")
        produced[n.name] = have | set(writes)
    for kind in ("source", "train"):
        cfg.node(kind)
    check_rounds(cfg)
    from rltf_ray.tasks import task_has_verifier

    critic = node_params(cfg.node("critique")).critic
    if not task_has_verifier(cfg.task.name) and critic not in ("llm_judge", "openai"):
        raise ConfigError(f"task '{cfg.task.name}' has no verifier: its rewards come from the "
                          f"critic's score, so use critic llm_judge or openai (got '{critic}')")
    if cfg.run.max_staleness > 0:
        if cfg.loss.rollout_correction == "none":
            raise ConfigError(f"run.max_staleness={cfg.run.max_staleness} trains on rollouts from older "
                              "policies: set loss.rollout_correction (tis_token, the default, as in verl "
                              "and SkyRL) for the importance-sampling correction")
        if critic == "learned":
            raise ConfigError("run.max_staleness > 0 is not supported with critic 'learned' (Bi-NAC's "
                              "critic trains on-policy on the critiques of the same step)")
    if critic != "learned" and cfg.binac.bilevel_lambda > 0:
        raise ConfigError(f"binac.bilevel_lambda={cfg.binac.bilevel_lambda} rewards a learned critic; the "
                          f"critique node's critic is '{critic}' (set pipeline.{cfg.node('critique').name}"
                          ".critic=learned)")
    if critic != "learned" and cfg.eval.critic_temperature is not None:
        raise ConfigError(f"eval.critic_temperature={cfg.eval.critic_temperature} sets the learned critic's "
                          f"temperature in an evaluation; the critique node's critic is '{critic}', which does "
                          "not sample (drop the setting, or set pipeline."
                          f"{cfg.node('critique').name}.critic=learned)")
    if critic == "learned":
        if cfg.binac.temperature == 0 and cfg.binac.critic_steps > 0:
            raise ConfigError("binac.temperature=0 (greedy) with a critic that trains: its K critiques of an "
                              "attempt would be identical, so every advantage is 0 and it never learns. Train it "
                              "at a temperature > 0; score it greedily with eval.critic_temperature=0")
        if cfg.run.turns != 2:
            raise ConfigError(f"critic 'learned' (Bi-NAC) runs two-turn episodes; got run.turns={cfg.run.turns}")
        if not task_has_verifier(cfg.task.name):
            raise ConfigError(f"critic 'learned' needs a task with a verifier to reward its critiques; "
                              f"'{cfg.task.name}' has none")
    check_sampling(cfg, order)
    for n in order:
        if n.kind != "source" and len(n.inputs) != 1:
            raise ConfigError(f"pipeline node '{n.name}': the executor runs chains; give exactly "
                              f"one input (got {len(n.inputs)})")
    return order


def check_sampling(cfg: Config, order: list[NodeSpec]) -> None:
    """Samples trained through the RL ratio pi_theta / pi_sampler must come from the full
    distribution at their temperature: with top_p < 1 vLLM's log-probs are renormalised over
    the nucleus and the trainer's are not, so the ratio would be wrong on every token."""
    for n in order:
        trained = n.kind == "generate" or (n.kind == "revise" and cfg.loss.turn1_rl)
        top_p = getattr(node_params(n), "top_p", 1.0)
        if trained and top_p < 1.0:
            raise ConfigError(f"pipeline node '{n.name}': top_p={top_p} on samples the RL ratio trains "
                              "(vLLM's log-probs are renormalised over the nucleus, the trainer's are "
                              "not); use top_p=1.0")


def describe(cfg: Config) -> str:
    lines = []
    for n in topo_order(cfg.pipeline):
        reads, writes = columns(n.kind, node_round(n))
        src = ", ".join(f"{p}<-{s}" for p, s in n.inputs.items()) or "-"
        lines.append(f"{n.name} [{n.kind}] inputs: {src}")
        lines.append(f"    reads:  {', '.join(reads) or '-'}")
        lines.append(f"    writes: {', '.join(writes) or '-'}")
        lines.append(f"    params: {node_params(n)}")
    return "\n".join(lines)


def to_dot(cfg: Config) -> str:
    out = ["digraph rltf {", "  rankdir=TB; node [shape=box, fontname=Helvetica];"]
    for n in cfg.pipeline:
        out.append(f'  "{n.name}" [label="{n.name}\\n({n.kind})"];')
    for n in cfg.pipeline:
        for src in n.inputs.values():
            cols = ", ".join(KINDS[n.kind].reads)
            out.append(f'  "{src}" -> "{n.name}" [label="{cols}", fontsize=9];')
    out.append("}")
    return "\n".join(out) + "\n"


def to_mermaid(cfg: Config) -> str:
    out = ["flowchart TD"]
    for n in cfg.pipeline:
        out.append(f'  {n.name}["{n.name} ({n.kind})"]')
    for n in cfg.pipeline:
        for src in n.inputs.values():
            out.append(f"  {src} --> {n.name}")
    return "\n".join(out) + "\n"


def to_svg(cfg: Config) -> str:
    """A self-contained layered drawing, so `.svg` needs no Graphviz install."""
    order = topo_order(cfg.pipeline)
    depth: dict[str, int] = {}
    for n in order:
        depth[n.name] = 1 + max((depth[s] for s in n.inputs.values()), default=-1)
    per_layer: dict[int, list[str]] = {}
    for n in order:
        per_layer.setdefault(depth[n.name], []).append(n.name)
    w, h, gap_y, gap_x = 220, 44, 40, 30
    pos = {name: (20 + i * (w + gap_x), 20 + d * (h + gap_y))
           for d, names in per_layer.items() for i, name in enumerate(names)}
    width = 40 + max(len(v) for v in per_layer.values()) * (w + gap_x)
    height = 40 + len(per_layer) * (h + gap_y)
    kinds = {n.name: n.kind for n in order}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="Helvetica" font-size="13">',
             '<defs><marker id="a" markerWidth="8" markerHeight="8" refX="8" refY="4" '
             'orient="auto"><path d="M0,0 L8,4 L0,8 z"/></marker></defs>']
    for n in order:
        for src in n.inputs.values():
            (x1, y1), (x2, y2) = pos[src], pos[n.name]
            parts.append(f'<line x1="{x1 + w / 2}" y1="{y1 + h}" x2="{x2 + w / 2}" y2="{y2}" '
                         'stroke="black" marker-end="url(#a)"/>')
    for name, (x, y) in pos.items():
        parts.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="#eef3fb" '
                     'stroke="#345"/>')
        parts.append(f'<text x="{x + w / 2}" y="{y + h / 2 + 4}" text-anchor="middle">'
                     f'{name} ({kinds[name]})</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def draw(cfg: Config, path: str) -> None:
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".dot":
        p.write_text(to_dot(cfg))
    elif suffix == ".mmd":
        p.write_text(to_mermaid(cfg))
    elif suffix == ".svg":
        p.write_text(to_svg(cfg))
    elif suffix == ".png":
        if shutil.which("dot") is None:
            raise ConfigError("--graph .png needs Graphviz's `dot` (apt-get install graphviz); "
                              ".svg, .dot and .mmd need nothing")
        subprocess.run(["dot", "-Tpng", "-o", str(p)], input=to_dot(cfg), text=True, check=True)
    else:
        raise ConfigError(f"--graph {path}: use a .svg, .png, .dot or .mmd file name")
