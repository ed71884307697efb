"""What the load generator sends, and when: request mixes, conversations, arrival times.

Workloads are built from text that ships with the project (`localserve/bench/data/pages.md` and the
scenario's prompt lists), seeded and reproducible. A single-request workload is a weighted mix
of kinds (short questions, long explanations, pastes of a few pages). The `conversation`
workload is multi-turn: each conversation reads the document part by part, every turn resending
the whole history (the server's replies included) plus a new part and a question, so the last
turn's prompt is ~2,000 tokens of which all but the new part could come from a prefix cache.

Two kinds ask for output that repeats the prompt, as speculative decoding's drafts from the
prompt expect (issue 37): `edit` pastes 1,000-3,000 tokens of the document and asks for it back
word for word with two or three named corrections (words taken from the slice, so the
corrections are real), and `quote` pastes ~1,500 tokens and asks for a summary that quotes three
sentences exactly.

Arrivals are open-loop at a request rate (Poisson, or gamma with a burstiness factor: < 1 is
burstier, 1 is Poisson); the closed loop (a fixed concurrency) needs no times.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from localserve.bench.scenario import (
    LONG_EXPLANATIONS,
    MEDIUM_QUESTIONS,
    SHORT_QUESTIONS,
    SUMMARY_REQUESTS,
    TOKENS_PER_WORD,
    pages,
    pages_slice,
)
from localserve.serve.prompt import render_transcript

# kind -> (output tokens, prompt builder); a mix is a weighted choice of kinds
KINDS = ("short", "long", "paste", "edit", "quote", "multiturn", "json")
WORKLOADS: dict[str, dict[str, float]] = {
    "short": {"short": 1.0},
    "long": {"long": 1.0},
    "paste": {"paste": 1.0},
    "mixed": {"short": 0.5, "long": 0.3, "paste": 0.2},
    "chat": {"short": 0.7, "long": 0.3},
    "edit": {"edit": 1.0},
    "quote": {"quote": 1.0},
    "multiturn": {"multiturn": 1.0},
    "json": {"json": 1.0},
}
OUTPUT_TOKENS = {
    "short": 48,
    "long": 320,
    "paste": 96,
    "edit": 256,
    "quote": 256,
    "multiturn": 256,
    "json": 256,
}
PASTE_TOKENS = 2500

EDIT_TOKENS = (1000, 2800)  # the edit's slice, drawn per request (whole paragraphs: <= ~3,000)
EDIT_CORRECTIONS = (2, 3)  # corrections per edit request
EDIT_REPLACEMENTS = (  # what a corrected word becomes (none of them is in the document)
    "lantern",
    "harbour",
    "meadow",
    "copper",
    "violet",
    "orchard",
    "pebble",
    "thunder",
    "saddle",
    "marble",
)
EDIT_REQUEST = "Repeat the text above word for word, with these corrections:"
QUOTE_TOKENS = 1500
QUOTE_REQUEST = "Summarise this text, quoting its three most important sentences exactly."

TURN_TOKENS = 350  # document tokens per user turn: turn 5's prompt is ~2,000 tokens
REPLY_TOKENS = 64
FIRST_PART = "Here is the first part of a document I am reading:"
NEXT_PART = "Here is the next part:"
TEXT_QUESTIONS = [
    "What is this part about? Answer in two sentences.",
    "Which detail in this part stands out most, and why?",
    "How does this part connect to what came before?",
    "Summarise this part for someone in a hurry.",
    "What is the main point of this part?",
    "What question would you ask the author about this part?",
]


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: a user message, after a history where it has one (the
    `multiturn` kind's earlier turns), under a `response_format` where it asks for one."""

    kind: str
    prompt: str
    max_tokens: int
    history: tuple[tuple[str, str], ...] = ()  # (role, content) before the prompt
    response_format: dict | None = None


@dataclass(frozen=True)
class Conversation:
    """One conversation's user messages, in order (the replies come from the server)."""

    user_messages: tuple[str, ...]


# --- single requests -----------------------------------------------------------------------------


def build_requests(
    workload: str, n: int, seed: int = 0, max_tokens: int | None = None
) -> list[RequestSpec]:
    """n requests of a named workload, reproducible for a seed.

    Each kind has its output length (OUTPUT_TOKENS); max_tokens, when given, replaces it for
    every request (the prompts are the same either way).
    """
    if workload not in WORKLOADS:
        raise ValueError(f"--workload: {workload!r} is not one of {', '.join(WORKLOADS)}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError("--max-tokens must be at least 1")
    rng = random.Random(seed)
    kinds, weights = zip(*WORKLOADS[workload].items(), strict=True)
    specs = [_spec(rng.choices(kinds, weights)[0], rng) for _ in range(n)]
    if max_tokens is None:
        return specs
    return [replace(s, max_tokens=max_tokens) for s in specs]


def _spec(kind: str, rng: random.Random) -> RequestSpec:
    if kind == "short":
        prompt = rng.choice(SHORT_QUESTIONS)
    elif kind == "long":
        prompt = rng.choice(LONG_EXPLANATIONS)
    elif kind == "edit":
        prompt = _edit_prompt(rng)
    elif kind == "quote":
        text = pages_slice(rng, round(QUOTE_TOKENS / TOKENS_PER_WORD))
        prompt = f"{text}\n\n{QUOTE_REQUEST}"
    elif kind == "multiturn":
        return _multiturn_spec(rng)
    elif kind == "json":
        return _json_spec(rng)
    else:
        text = pages_slice(rng, round(PASTE_TOKENS / TOKENS_PER_WORD))
        prompt = f"{text}\n\n{rng.choice(SUMMARY_REQUESTS)}"
    if kind == "short" and rng.random() < 0.3:
        prompt = rng.choice(MEDIUM_QUESTIONS)
    return RequestSpec(kind, prompt, OUTPUT_TOKENS[kind])


def _edit_prompt(rng: random.Random) -> str:
    """A slice of the document and a request to repeat it with a few corrections of its words."""
    text = pages_slice(rng, round(rng.randint(*EDIT_TOKENS) / TOKENS_PER_WORD))
    words = sorted({w for w in (t.strip(".,;:!?") for t in text.split()) if _correctable(w)})
    n = rng.randint(*EDIT_CORRECTIONS)
    pairs = zip(rng.sample(words, n), rng.sample(EDIT_REPLACEMENTS, n), strict=True)
    corrections = [f'replace "{old}" with "{new}"' for old, new in pairs]
    listed = ", ".join(corrections[:-1]) + f" and {corrections[-1]}"
    return f"{text}\n\n{EDIT_REQUEST} {listed}."


# --- what copies from a conversation or a document: multiturn, json -------------------------------

CODE_FUNCTIONS = 8  # functions in the multiturn workload's file (~550 tokens a version)
CODE_TURNS = 4  # the request is the 4th turn: three versions of the file before it
CODE_VERBS = ("load", "parse", "merge", "count", "check", "render", "update", "split", "sort")
CODE_NOUNS = ("orders", "rows", "names", "totals", "events", "pages", "users", "notes", "tags")
CODE_RENAMES = ("records", "entries", "items", "values", "chunks", "lines", "parts", "fields")
FILE_REQUEST = "Reply with the whole file, changed, and nothing else."
JSON_REQUEST = (
    "Extract the customer's name, email and street address, the ordered items with their"
    " quantities, and the customer's note (word for word) as JSON."
)
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "email": {"type": "string"},
        "address": {"type": "string"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"product": {"type": "string"}, "quantity": {"type": "integer"}},
                "required": ["product", "quantity"],
            },
        },
        "note": {"type": "string"},
    },
    "required": ["name", "email", "address", "items", "note"],
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "order", "schema": JSON_SCHEMA}}
FIRST_NAMES = ("Ada", "Bruno", "Chiara", "Dmitri", "Elif", "Farah", "Goran", "Hana", "Ivo")
LAST_NAMES = ("Moreau", "Okafor", "Lindqvist", "Tanaka", "Novak", "Haddad", "Costa", "Berg")
STREETS = ("Mill Lane", "Harbour Road", "Chestnut Avenue", "Old Quay", "Station Street")
PRODUCTS = ("copper kettle", "wool blanket", "oak chopping board", "linen apron", "tea tin")


def _code_file(rng: random.Random) -> str:
    """A small Python module of CODE_FUNCTIONS functions (seeded)."""
    out = ['"""Helpers for the nightly report."""', "", "import json", ""]
    names = rng.sample([f"{v}_{n}" for v in CODE_VERBS for n in CODE_NOUNS], CODE_FUNCTIONS)
    for name in names:
        verb, noun = name.split("_")
        limit = rng.randint(2, 90)
        out += [
            "",
            f"def {name}(source, limit={limit}):",
            f'    """{verb.capitalize()} the {noun} of source, at most limit of them."""',
            f"    {noun} = [x for x in source.get({noun!r}, []) if x is not None]",
            f"    if len({noun}) > limit:",
            f"        {noun} = {noun}[:limit]",
            f"    return json.dumps({{{noun!r}: {noun}, 'count': len({noun})}})",
        ]
    return "\n".join(out) + "\n"


def _multiturn_spec(rng: random.Random) -> RequestSpec:
    """The 4th turn of a conversation editing a file: each earlier turn asked for a rename and
    its reply (here the ideal one, the same for every server) repeated the whole file changed;
    the 4th asks once more, so the reply repeats most of the 3rd version."""
    code = _code_file(rng)
    nouns = [n for n in CODE_NOUNS if f"{n} = [" in code]
    history: list[tuple[str, str]] = []
    renames = zip(rng.sample(nouns, CODE_TURNS), CODE_RENAMES[:CODE_TURNS], strict=True)
    for turn, (old, new) in enumerate(renames):
        ask = f"Rename the variable `{old}` to `{new}` everywhere. {FILE_REQUEST}"
        if turn == 0:
            ask = f"Here is a Python file:\n\n```python\n{code}```\n\n{ask}"
        if turn == CODE_TURNS - 1:
            return RequestSpec("multiturn", ask, OUTPUT_TOKENS["multiturn"], tuple(history))
        code = re.sub(rf"(?<!['_]){old}\b(?!')", new, code)  # the variable, not the key
        history += [("user", ask), ("assistant", f"```python\n{code}```")]
    raise AssertionError("unreachable")


def _json_spec(rng: random.Random) -> RequestSpec:
    """A pasted order (a page of text around its details) and a schema'd extraction of it."""
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    email = f"{first.lower()}.{last.lower()}@example.org"
    address = f"{rng.randint(2, 180)} {rng.choice(STREETS)}, {rng.choice(LAST_NAMES)}ton"
    items = [f"{rng.randint(1, 6)} x {p}" for p in rng.sample(PRODUCTS, 3)]
    note = pages_slice(rng, 40).split("\n")[0]
    page = pages_slice(rng, round(600 / TOKENS_PER_WORD))
    letter = (
        f"Order received from {first} {last} ({email}), to be delivered to {address}.\n"
        f"Items: {', '.join(items)}.\nCustomer's note: {note}"
    )
    prompt = f"{page}\n\n{letter}\n\n{JSON_REQUEST}"
    return RequestSpec("json", prompt, OUTPUT_TOKENS["json"], response_format=JSON_FORMAT)


def _correctable(word: str) -> bool:
    """A lower-case word of five letters or more (no names, numbers or hyphenated words)."""
    return len(word) >= 5 and word.isalpha() and word.islower()


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Start offsets (s) of n requests: gamma inter-arrivals with mean 1/rate (inf = all at 0)."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError("--request-rate and --burstiness must be positive")
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


# --- conversations -------------------------------------------------------------------------------


def _document_words() -> list[tuple[str, bool]]:
    """pages.md as (word, ends a paragraph) pairs."""
    return [(w, i == len(p.split()) - 1) for p in pages() for i, w in enumerate(p.split())]


def build_conversations(
    n: int, turns: int, turn_tokens: int = TURN_TOKENS, seed: int = 0
) -> list[Conversation]:
    """n conversations reading pages.md part by part, reproducible for a seed.

    Each user turn is a new part of ~turn_tokens tokens (consecutive words of the text, from a
    random paragraph start, wrapping around at its end) and a question about it.
    """
    if n < 1 or turns < 1 or turn_tokens < 1:
        raise ValueError("--conversations, --turns and --turn-tokens must be at least 1")
    rng = random.Random(seed)
    words = _document_words()
    starts = [0] + [i + 1 for i, (_, end) in enumerate(words[:-1]) if end]
    per_turn = max(1, round(turn_tokens / TOKENS_PER_WORD))
    out = []
    for _ in range(n):
        at = rng.choice(starts)
        messages = []
        for turn in range(turns):
            part = [words[(at + j) % len(words)] for j in range(per_turn)]
            at = (at + per_turn) % len(words)
            text = "".join(w + ("\n\n" if end else " ") for w, end in part).strip()
            intro = FIRST_PART if turn == 0 else NEXT_PART
            messages.append(f"{intro}\n\n{text}\n\n{rng.choice(TEXT_QUESTIONS)}")
        out.append(Conversation(tuple(messages)))
    return out


def turn_messages(conv: Conversation, replies: Sequence[str], turn: int) -> list[tuple[str, str]]:
    """The messages of turn `turn` (1-based): the history so far, then the new user message."""
    if len(replies) < turn - 1:
        raise ValueError(f"turn {turn} needs {turn - 1} replies, got {len(replies)}")
    messages = []
    for k in range(turn - 1):
        messages += [("user", conv.user_messages[k]), ("assistant", replies[k])]
    return [*messages, ("user", conv.user_messages[turn - 1])]


def estimate_prompt_tokens(messages: Sequence[tuple[str, str]]) -> int:
    """Rough prompt size of the rendered transcript (words x TOKENS_PER_WORD)."""
    return round(len(render_transcript(messages).split()) * TOKENS_PER_WORD)
