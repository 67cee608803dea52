"""The protocol notes the code relies on are docs/protocol.md, in this repository: no file cites notes
outside it, and every `docs/protocol.md §N` a file cites is a section there."""
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "protocol.md"


def tracked_text_files():
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        path = REPO / name
        if path.is_file() and path.suffix in {".py", ".pyx", ".pxd", ".pyi", ".h", ".md", ".toml", ".txt", ""}:
            yield name, path.read_text(errors="replace")


def doc_sections() -> set[str]:
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", DOC.read_text(), re.M))


def test_no_file_cites_notes_outside_the_repository():
    outside = "shared" + "/protocol"  # (spelled so that this file does not name it)
    offenders = [name for name, text in tracked_text_files() if outside in text]
    assert offenders == []
    assert not [name for name, text in tracked_text_files() if "REMOTING" + ".md" in text]


def test_every_cited_section_exists():
    sections = doc_sections()
    assert {"1", "4.4", "5", "5.5", "9"} <= sections
    cited = {}
    for name, text in tracked_text_files():
        for m in re.finditer(r"docs/protocol\.md((?:[\s,]*(?:and\s+)?§[\d.]*\d(?:-\d+)?)+)", text):
            for ref in re.findall(r"§([\d.]*\d)(?:-(\d+))?", m.group(1)):
                for sec in ([ref[0]] if not ref[1] else [str(n) for n in range(int(ref[0]), int(ref[1]) + 1)]):
                    cited.setdefault(sec, []).append(name)
    assert len(cited) >= 8
    missing = {sec: names for sec, names in cited.items() if sec not in sections}
    assert missing == {}
