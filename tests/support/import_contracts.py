"""lint-imports run on a scratch copy of the source tree, once as it is and once per added import.

`lint_with_each(tree, edits)` starts one process (this file run as a script, with only the copy
on its path, so grimp reads the copy and not the checkout) that runs import-linter in-process for
each edit in turn: the line appended to the module, lint-imports, the module restored. One
process for all of them: most of a lint-imports run is Python starting and importing it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

Edit = tuple[str, str] | None  # (a module's path in the tree, the line appended to it), or none


class Lint(NamedTuple):
    """One run of lint-imports: its exit status, each contract's verdict, what it printed."""

    status: int
    verdicts: dict[str, str]  # the contract's name: KEPT or BROKEN
    output: str


def lint_with_each(tree: Path, edits: list[Edit]) -> list[Lint]:
    """lint-imports on `tree` for each edit in turn."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "500", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-P", __file__],  # -P: tests/support/ not on its path (its names)
        cwd=tree,
        env=env,
        input=json.dumps(edits),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [
        Lint(status, dict(re.findall(r"^(.+?) (KEPT|BROKEN)\b", out, re.M)), out)
        for status, out in json.loads(done.stdout)
    ]


def _lint_once(edit: Edit) -> tuple[int, str]:
    from importlinter.cli import lint_imports

    path = Path(edit[0]) if edit else None
    source = path.read_text("utf-8") if path else ""
    if path:
        path.write_text(f"{source}\n{edit[1]}\n", "utf-8")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            status = lint_imports(no_cache=True)
    finally:
        if path:
            path.write_text(source, "utf-8")
    return status, out.getvalue()


if __name__ == "__main__":
    print(json.dumps([_lint_once(edit) for edit in json.load(sys.stdin)]))
