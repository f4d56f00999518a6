"""The declarative pipeline graph: node kinds, the Arrow columns each reads and writes,
their typed parameters, validation before anything starts, and drawing.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rltf_ray.config import Config, ConfigError, NodeSpec, _build

DEFAULT_REVISION_TEMPLATE = (
    "Here is feedback on your previous answer:\n{critique}\n\n"
    "Using this feedback, solve the problem again. Give your final answer as <answer>...</answer>."
)


@dataclass(frozen=True)
class SourceParams:
    prompts_per_step: int = 8
    # JSONL or Parquet with `prompt` and `meta` columns; None = the task's generator.
    path: str | None = None
    batch_size: int = 64


@dataclass(frozen=True)
class GenerateParams:
    n: int = 4  # samples per prompt (the group)
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128
    batch_size: int = 32


@dataclass(frozen=True)
class CritiqueParams:
    critic: str = "programmatic"
    app_name: str = "rltf_critic"
    # Attach to an already running critic app of that name instead of deploying one.
    attach: bool = False
    # A correct first answer ends the episode: no critique request and no revision.
    early_termination: bool = True
    batch_size: int = 32
    timeout_s: float = 60.0
    retries: int = 2
    backoff_s: float = 0.5
    num_replicas: int = 1
    # Serve autoscaling: used when max_replicas is set.
    min_replicas: int = 1
    max_replicas: int | None = None
    target_ongoing_requests: float = 16.0
    max_batch_size: int = 64
    batch_wait_timeout_s: float = 0.01
    # llm_judge: the judge's own model (any HF folder; "smollm2"/"tiny" = built-in).
    judge_model: str = "smollm2"
    judge_max_tokens: int = 256
    # openai: an OpenAI-compatible endpoint; the key is read from env var `api_key_env`.
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None

    def __post_init__(self):
        critics = ("programmatic", "correctness_only", "llm_judge", "openai")
        if self.critic not in critics:
            raise ConfigError(f"critic: unknown critic {self.critic!r} (known: {', '.join(critics)})")
        if self.critic == "openai" and not (self.base_url and self.model):
            raise ConfigError("critic 'openai' needs base_url and model")
        if self.retries < 0 or self.timeout_s <= 0:
            raise ConfigError("retries must be >= 0 and timeout_s > 0")


@dataclass(frozen=True)
class ReviseParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 128
    template: str = DEFAULT_REVISION_TEMPLATE
    batch_size: int = 32


@dataclass(frozen=True)
class RewardParams:
    batch_size: int = 64


@dataclass(frozen=True)
class TrainParams:
    pass


@dataclass(frozen=True)
class NodeKind:
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    params: type
    description: str


KINDS: dict[str, NodeKind] = {
    "source": NodeKind((), ("step", "prompt_id", "prompt", "meta"), SourceParams,
                       "prompt rows for one RL step (file or task generator)"),
    "generate": NodeKind(("prompt",), ("sample_idx", "prompt_ids", "response", "response_ids",
                                       "response_logprobs", "policy_version"), GenerateParams,
                         "first turn: N vLLM samples per prompt"),
    "critique": NodeKind(("prompt", "response", "meta"),
                         ("reward_first", "correct_first", "format_first", "critique",
                          "critique_failed", "critique_error", "critic_disagrees", "revised"),
                         CritiqueParams,
                         "reward r0 and critique c0 from the Serve critic"),
    "revise": NodeKind(("prompt", "response", "critique", "revised"),
                       ("revision_prompt_ids", "revision", "revision_ids", "revision_logprobs"),
                       ReviseParams, "second turn: one revision y1 from x1=[x0,y0,c0]"),
    "reward": NodeKind(("revision", "revised", "meta", "reward_first"), ("reward_second", "correct_second", "format_second"),
                       RewardParams, "score the revision with the task verifier"),
    "train": NodeKind(("prompt_id", "prompt", "prompt_ids", "response", "response_ids",
                       "reward_first", "critique", "revision_ids", "reward_second"), (),
                      TrainParams, "Ray Train + DeepSpeed learner (GRPO + SD + FM)"),
}


def node_params(node: NodeSpec):
    """The node's typed parameters (defaults filled in); raises ConfigError naming the node."""
    return _build(KINDS[node.kind].params, node.params, f"pipeline node '{node.name}' params")


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
        for col in KINDS[n.kind].reads:
            if col not in have:
                raise ConfigError(f"pipeline node '{n.name}': needs column '{col}' but no upstream "
                                  f"node produces it")
        produced[n.name] = have | set(KINDS[n.kind].writes)
    for kind in ("source", "train"):
        cfg.node(kind)
    for n in order:
        if n.kind != "source" and len(n.inputs) != 1:
            raise ConfigError(f"pipeline node '{n.name}': the executor runs chains; give exactly "
                              f"one input (got {len(n.inputs)})")
    return order


def describe(cfg: Config) -> str:
    lines = []
    for n in topo_order(cfg.pipeline):
        k = KINDS[n.kind]
        src = ", ".join(f"{p}<-{s}" for p, s in n.inputs.items()) or "-"
        lines.append(f"{n.name} [{n.kind}] inputs: {src}")
        lines.append(f"    reads:  {', '.join(k.reads) or '-'}")
        lines.append(f"    writes: {', '.join(k.writes) or '-'}")
        lines.append(f"    params: {node_params(n)}")
    return "\n".join(lines)


def to_dot(cfg: Config) -> str:
    out = ["digraph rltf {", "  rankdir=TB; node [shape=box, fontname=Helvetica];"]
    for n in cfg.pipeline:
        out.append(f'  "{n.name}" [label="{n.name}\\n({n.kind})"];')
    for n in cfg.pipeline:
        for src in n.inputs.values():
            cols = ", ".join(c for c in KINDS[n.kind].reads)
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
