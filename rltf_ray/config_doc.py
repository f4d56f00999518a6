"""The configuration reference, generated from the config dataclasses themselves: every
field of every section and of every pipeline node's params, with its type, its default and
the comment beside it in the code (docs/config.md).

    .venv/bin/python -m rltf_ray.config_doc > docs/config.md

`tests/test_config_doc.py` fails when a field has no comment or when docs/config.md is not
what this prints."""
from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import textwrap
import typing

FIELD = re.compile(r"^    (\w+): [^=]+(=.*)?$")


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment: the `#` lines right above it, then one after it on its line."""
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    block: list[str] = []
    for line in textwrap.dedent("".join(inspect.getsourcelines(cls)[0])).splitlines():
        code, _, trail = line.partition("  #")
        if line.strip().startswith("#"):
            block.append(line.strip().lstrip("#").strip())
            continue
        m = FIELD.match(code.rstrip())
        if m and m.group(1) in names:
            out[m.group(1)] = " ".join(block + ([trail.strip()] if trail.strip() else []))
        block = []
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _type(f: dataclasses.Field) -> str:
    return str(f.type).replace("typing.", "")


def table(cls: type) -> list[str]:
    comments = field_comments(cls)
    rows = ["| key | type | default | what it sets |", "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        text = comments.get(f.name, "").replace("|", "\\|")
        default = _default(f).replace("|", "\\|").replace("\n", "\\n")
        rows.append(f"| `{f.name}` | `{_type(f).replace('|', '&#124;')}` | `{default}` | {text} |")
    return rows


def _summary(cls: type) -> str:
    """The first paragraph of the class's own docstring ("" for dataclass's generated one)."""
    doc = cls.__doc__ or ""
    return "" if doc.startswith(cls.__name__ + "(") else inspect.cleandoc(doc).split("\n\n")[0]


def sections() -> list[tuple[str, type, str]]:
    from rltf_ray import config as C
    from rltf_ray.graph import KINDS

    hints = typing.get_type_hints(C.Config)
    out = [(f.name, hints[f.name], _summary(hints[f.name]))
           for f in dataclasses.fields(C.Config) if dataclasses.is_dataclass(hints[f.name])]
    out += [(f"pipeline node of kind `{kind}`", k.params, k.description)
            for kind, k in KINDS.items() if dataclasses.fields(k.params)]
    return out


def reference() -> str:
    from rltf_ray.config import Config

    lines = ["# Configuration reference", "",
             "Every key a config file, a `section.key=value` override or the Python API's setters "
             "accept, generated from the config dataclasses (`python -m rltf_ray.config_doc`): "
             "its type, its default and what it sets. Node parameters are set as "
             "`pipeline.<node name>.<param>=value`. Unknown keys and wrong types are errors "
             "that name the key. Formulas of the loss settings: [objectives.md](objectives.md).", ""]
    lines += ["## Top-level keys", "",
              "| key | what it sets |", "| --- | --- |",
              "| `preset` | an objective preset by name (`--list-presets`) or the path of a preset YAML; "
              "the config's own values win over it, except keys it locks |",
              f"| `plugins` | {field_comments(Config)['plugins']} |",
              "| `pipeline` | the graph: a list of nodes `{name, kind, inputs, params}` (kinds below); "
              "omitted, the default two-turn graph |", ""]
    for name, cls, doc in sections():
        title = name if name.startswith("pipeline") else f"`{name}`"
        lines += [f"## {title}", ""] + ([" ".join(doc.split()), ""] if doc else []) + table(cls) + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(reference())
