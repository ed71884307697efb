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

Edit = tuple[str, str] | None  # (a module's path in the tree, the line appended to it), or none


def lint_with_each(tree: Path, edits: list[Edit]) -> list[tuple[int, dict[str, str]]]:
    """For each edit, lint-imports' exit status and each contract's verdict (KEPT or BROKEN)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "500", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, __file__],
        cwd=tree,
        env=env,
        input=json.dumps(edits),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    runs = json.loads(done.stdout)
    return [
        (status, dict(re.findall(r"^(.+?) (KEPT|BROKEN)\b", out, re.M))) for status, out in runs
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
