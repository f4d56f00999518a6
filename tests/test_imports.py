"""No two modules of rltf_ray import each other, directly or around a circle, counting imports
inside functions and under TYPE_CHECKING: every module can be read and tested with only the
ones below it."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rltf_ray"


def module_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in its text."""
    files = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                targets |= {base} | {f"{base}.{a.name}" for a in node.names}
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    return found


def test_the_circle_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_circle():
    graph = module_graph()
    assert "rltf_ray.tasks.rewards" in graph["rltf_ray.loading"] | graph["rltf_ray.tasks"]  # the graph sees imports
    found = circles(graph)
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found[:5])


def test_the_config_imports_no_task():
    assert not [m for m in module_graph()["rltf_ray.config"] if m.startswith("rltf_ray.tasks")]
