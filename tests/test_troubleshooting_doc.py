"""docs/troubleshooting.md quotes every warning a run can print: a new WARNING without an
entry fails here."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def warning_phrases() -> list[tuple[str, str]]:
    """(file, the longest literal stretch of the line) for each line that starts a WARNING
    message in the library or the pipelines: the part a user can search the page for."""
    out = []
    for path in sorted([*(ROOT / "rltf_ray").rglob("*.py"), *(ROOT / "pipelines").glob("*.py")]):
        for line in path.read_text().splitlines():
            if re.search(r'f?"(\[compare\] )?WARNING[ :]', line):
                literal = re.split(r"\{[^}]*\}", line.split('"', 1)[1].rsplit('"', 1)[0])
                out.append((path.name, max((x.strip() for x in literal), key=len)))
    return out


def test_every_warning_has_an_entry():
    found = warning_phrases()
    assert len(found) >= 7  # the ones the page describes today: the scan sees them
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    missing = [(f, p) for f, p in found if p not in page]
    assert missing == []
