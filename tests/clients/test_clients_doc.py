"""docs/clients.md quotes the client sources that CI compiles and runs, verbatim.

Each fenced block preceded by `<!-- snippet: PATH#NAME -->` must equal the lines between
`// snippet: NAME` and `// end snippet` in PATH (dedented, without trailing blank lines: gofmt puts
one between a function and the comment after it), so a change to a client that is not carried into
the docs (or the other way round) fails here. All five clients CI builds and runs are quoted."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "clients.md"
COMPILED = ("clients/ts/client.ts", "clients/ts-connect/client.ts", "clients/go/cmd/motor-client/main.go",
            "clients/java/src/MotorClient.java", "clients/cpp/motor_client.cc")
MARKER = re.compile(r"<!-- snippet: (?P<path>[\w./-]+)#(?P<name>[\w-]+) -->\n```\w*\n(?P<body>.*?)\n```", re.S)


def cut(path: Path, name: str) -> str:
    lines = path.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == f"// snippet: {name}"]
    assert len(starts) == 1, f"{path}: {len(starts)} '// snippet: {name}' markers"
    end = next(i for i in range(starts[0], len(lines)) if lines[i].strip() == "// end snippet")
    return textwrap.dedent("\n".join(lines[starts[0] + 1:end])).rstrip("\n")


def test_doc_snippets_are_the_client_sources() -> None:
    found = list(MARKER.finditer(DOC.read_text()))
    quoted = {(m["path"], m["name"]) for m in found}
    # every client is quoted: channel/transport (with TLS), metadata/context, registry, dispatch, error reason
    assert {p for p, _ in quoted} == set(COMPILED)
    assert len(found) == len(quoted) == 26  # ts 7 (+ proto-loader's load and unary), ts-connect 4, go 5, java 5, cpp 5
    for m in found:
        assert m["body"] == cut(ROOT / m["path"], m["name"]), f"docs/clients.md {m['path']}#{m['name']} differs"


def test_every_marked_snippet_is_quoted() -> None:
    quoted = {(m["path"], m["name"]) for m in MARKER.finditer(DOC.read_text())}
    for path in COMPILED:
        names = re.findall(r"^\s*// snippet: ([\w-]+)$", (ROOT / path).read_text(), re.M)
        assert names and {(path, n) for n in names} <= quoted, f"{path}: a marked snippet is not in the docs"
