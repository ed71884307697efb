"""Regenerate the reference renderings of the chat templates in tests/data/templates/.

Each template there is rendered with the real `transformers` library (its
`render_jinja_template`, what `tokenizer.apply_chat_template` calls) for each conversation in
tests/data/templates/conversations.json; tests/unit/chat/test_templates.py checks that
localserve.chat.templates renders exactly the same text. A template that refuses a
conversation (raise_exception, or a TypeError on content it cannot handle) gets an `.error` file
with transformers' message instead.

transformers is needed for this script only (it is no dependency of localserve):

    pip install transformers
    python scripts/template_references.py
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import transformers.utils.chat_template_utils as hf

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "templates"


def main() -> int:
    spec = json.loads((DATA / "conversations.json").read_text(encoding="utf-8"))
    now = datetime.fromisoformat(spec["now"])

    class FixedClock(datetime):  # strftime_now reads transformers' module-level `datetime`
        @classmethod
        def now(cls, tz=None):
            return now

    hf.datetime = FixedClock
    for stem, (bos, eos) in spec["tokens"].items():
        source = (DATA / f"{stem}.jinja").read_text(encoding="utf-8")
        out = DATA / "expected" / stem
        out.mkdir(parents=True, exist_ok=True)
        for case, chat in spec["cases"].items():
            for old in out.glob(f"{case}.*"):
                old.unlink()
            try:
                rendered, _ = hf.render_jinja_template(
                    conversations=[chat["messages"]],
                    tools=chat.get("tools"),
                    chat_template=source,
                    add_generation_prompt=chat.get("add_generation_prompt", True),
                    bos_token=bos,
                    eos_token=eos,
                    **chat.get("kwargs", {}),
                )
            except (jinja2.TemplateError, TypeError) as e:  # the template refuses this chat
                (out / f"{case}.error").write_text(str(e), encoding="utf-8")
                continue
            (out / f"{case}.txt").write_text(rendered[0], encoding="utf-8", newline="")
    print(f"wrote {DATA / 'expected'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
