"""The configuration reference (docs/config.md) is generated from the config dataclasses:
every field has its comment in the code, and the committed page is what the code prints."""
import dataclasses
from pathlib import Path

from rltf_ray.config_doc import field_comments, reference, sections

ROOT = Path(__file__).resolve().parent.parent


def test_every_config_field_has_a_comment():
    missing = [f"{name}.{f.name}" for name, cls, _ in sections() for f in dataclasses.fields(cls)
               if not field_comments(cls).get(f.name)]
    assert not missing, f"config fields without a comment in the code (docs/config.md is built from them): {missing}"


def test_the_committed_reference_is_current():
    assert (ROOT / "docs" / "config.md").read_text() == reference(), (
        "docs/config.md is out of date: .venv/bin/python -m rltf_ray.config_doc > docs/config.md")


def test_comments_are_read_from_above_and_beside_a_field():
    @dataclasses.dataclass
    class Probe:
        # the first line
        # and the second
        a: int = 1
        b: str = "x"  # beside it
        c: float = 0.5

    got = field_comments(Probe)
    assert got == {"a": "the first line and the second", "b": "beside it", "c": ""}
