"""Which grammar engine should constrain a request's sampling to a JSON schema (issue 28)?

A one-off whose decision is made: llguidance (docs/benchmarks.md, "Structured output: choosing
the grammar engine"). Kept because it is the way to revisit the choice when a candidate's
version moves; it imports nothing of localserve but the embedded model's path.

Candidates, all on the embedded model's own vocabulary (Gemma 3, 262,144 tokens, loaded
vocab-only through llama.cpp):

  llguidance   LLTokenizer from the llama.cpp vocab, LLMatcher per request, a 1-bit-per-token
               mask computed into a numpy buffer.
  llama.cpp    GBNF grammar sampler (llama_sampler_init_grammar), the schema turned into GBNF
               by llama_cpp.llama_grammar.json_schema_to_gbnf; a mask step is one
               llama_sampler_apply over the whole vocabulary's candidates (what a chain does
               when the grammar comes first) and one llama_sampler_accept.
  outlines-core  Vocabulary from the same token bytes, Index over the schema's regex
               (json_schema.build_regex_from_schema), Guide per request.
  xgrammar     not measured: its wheel requires torch (several GB of CUDA wheels) here.

Figures: tokenizer (vocabulary) set-up time, compile time of a small and a realistic schema
(pydantic), per-token mask time (mean, p99) while following a JSON document of the realistic
schema token by token, and which JSON-schema keywords each accepts (refused / ignored / kept).

Run: .venv/bin/python benchmarks/grammar_engine_choice.py [--rounds 3]
Prints markdown tables; raw figures go to bench-results/grammar_engine_choice.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path

import llama_cpp
import numpy as np
from pydantic import BaseModel, Field

MODEL = Path.home() / ".cache/localserve/models/gemma-3-270m-q4_k_m.gguf"


class Small(BaseModel):
    name: str
    age: int


class Address(BaseModel):
    street: str
    city: str
    postcode: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=40)
    age: int = Field(ge=0, le=150)
    email: str | None = None
    tags: list[str] = Field(max_length=5)
    role: str = Field(json_schema_extra={"enum": ["admin", "user", "guest"]})
    address: Address
    scores: list[float]


DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "tags": ["math", "engines"],
    "role": "admin",
    "address": {"street": "12 St James's Square", "city": "London", "postcode": "12345"},
    "scores": [9.5, 8.25, 10.0],
}

KEYWORDS = {
    "enum": {"type": "string", "enum": ["a", "b"]},
    "const": {"const": "x"},
    "anyOf": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    "oneOf": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}]},
    "$ref/$defs": {"$defs": {"A": {"type": "integer"}}, "$ref": "#/$defs/A"},
    "pattern": {"type": "string", "pattern": "^[a-z]+$"},
    "format (date-time)": {"type": "string", "format": "date-time"},
    "minLength/maxLength": {"type": "string", "minLength": 2, "maxLength": 4},
    "minimum/maximum": {"type": "integer", "minimum": 1, "maximum": 9},
    "exclusiveMinimum": {"type": "number", "exclusiveMinimum": 0},
    "multipleOf": {"type": "integer", "multipleOf": 5},
    "minItems/maxItems": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
    "prefixItems": {"type": "array", "prefixItems": [{"type": "integer"}]},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "additionalProperties": {"type": "object", "additionalProperties": {"type": "integer"}},
    "patternProperties": {"type": "object", "patternProperties": {"^a": {"type": "integer"}}},
    "minProperties": {"type": "object", "minProperties": 1},
    "not": {"not": {"type": "string"}},
    "if/then/else": {"if": {"type": "string"}, "then": {"minLength": 1}},
    "contains": {"type": "array", "contains": {"type": "integer"}},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
}


def load_vocab():
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(MODEL).encode(), params)
    return model, llama_cpp.llama_model_get_vocab(model)


def token_bytes(vocab) -> list[bytes]:
    buf = ctypes.create_string_buffer(256)
    out = []
    for t in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        n = llama_cpp.llama_token_to_piece(vocab, t, buf, 256, 0, True)
        out.append(buf.raw[:n])
    return out


def stats(xs: list[float]) -> dict:
    a = np.array(xs) * 1e3
    return {"mean_ms": float(a.mean()), "p99_ms": float(np.percentile(a, 99)), "n": len(xs)}


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


# --- llguidance ----------------------------------------------------------------------------


def bench_llguidance(vocab, doc_tokens: list[int]) -> dict:
    import llguidance
    import llguidance.llamacpp
    import llguidance.numpy as lnp

    tok, setup = timed(llguidance.llamacpp.lltokenizer_from_vocab, vocab)
    compile_s = {}
    for name, model in (("small", Small), ("realistic", Person)):
        grammar = llguidance.LLMatcher.grammar_from_json_schema(model.model_json_schema())
        m, compile_s[name] = timed(llguidance.LLMatcher, tok, grammar)
        assert not m.is_error(), m.get_error()
    mask = lnp.allocate_token_bitmask(1, tok.vocab_size)
    steps = []
    for t in doc_tokens:
        start = time.perf_counter()
        lnp.fill_next_token_bitmask(m, mask)
        steps.append(time.perf_counter() - start)
        assert (mask[0, t // 32] >> (t % 32)) & 1, f"llguidance refused token {t}"
        m.consume_token(t)
    coverage = {}
    for kw, schema in KEYWORDS.items():
        try:
            g = llguidance.LLMatcher.grammar_from_json_schema(schema)
            err = llguidance.LLMatcher.validate_grammar(g, tok)
        except ValueError as e:
            err = str(e)
        coverage[kw] = "kept" if not err else "refused"
    return {"setup_s": setup, "compile_s": compile_s, "mask": stats(steps), "coverage": coverage}


# --- llama.cpp GBNF ------------------------------------------------------------------------


def bench_llamacpp(vocab, doc_tokens: list[int]) -> dict:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    compile_s = {}
    for name, model in (("small", Small), ("realistic", Person)):
        start = time.perf_counter()
        gbnf = json_schema_to_gbnf(json.dumps(model.model_json_schema()))
        smp = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        compile_s[name] = time.perf_counter() - start
        assert smp, "llama.cpp refused the grammar"
    data = (llama_cpp.llama_token_data * n_vocab)()
    arr = llama_cpp.llama_token_data_array(data, n_vocab, -1, False)
    steps = []
    for t in doc_tokens:
        for i in range(0, n_vocab):  # fresh candidates (not timed: the chain fills them anyway)
            data[i].id, data[i].logit, data[i].p = i, 0.0, 0.0
        arr.size, arr.selected, arr.sorted = n_vocab, -1, False
        start = time.perf_counter()
        llama_cpp.llama_sampler_apply(smp, ctypes.byref(arr))
        applied = time.perf_counter()
        if data[t].logit == float("-inf"):  # accepting it would abort the process (C++ throw)
            break
        start2 = time.perf_counter()
        llama_cpp.llama_sampler_accept(smp, t)
        steps.append(applied - start + time.perf_counter() - start2)
        if len(steps) >= 40:  # ~0.1 s of Python refill per step: 40 are enough for the figure
            break
    llama_cpp.llama_sampler_free(smp)
    coverage = {}
    for kw, schema in KEYWORDS.items():
        try:
            json_schema_to_gbnf(json.dumps(schema))
            coverage[kw] = "accepted"
        except Exception:
            coverage[kw] = "refused"
    return {"setup_s": 0.0, "compile_s": compile_s, "mask": stats(steps), "coverage": coverage}


# --- outlines-core -------------------------------------------------------------------------


def bench_outlines(vocab, pieces: list[bytes], doc_tokens: list[int]) -> dict:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    eos = llama_cpp.llama_vocab_eos(vocab)
    start = time.perf_counter()
    mapping: dict[bytes, list[int]] = {}
    for t, p in enumerate(pieces):
        if p and t != eos and not llama_cpp.llama_token_get_attr(vocab, t) & 1 << 3:
            mapping.setdefault(p, []).append(t)
    voc = Vocabulary(eos, mapping)
    setup = time.perf_counter() - start
    compile_s = {}
    for name, model in (("small", Small), ("realistic", Person)):
        start = time.perf_counter()
        regex = build_regex_from_schema(json.dumps(model.model_json_schema()))
        index = Index(regex, voc)
        compile_s[name] = time.perf_counter() - start
    guide = Guide(index)
    mask = np.zeros((len(pieces) + 31) // 32, dtype=np.int32)
    steps = []
    for t in doc_tokens:
        start = time.perf_counter()
        guide.write_mask_into(mask.ctypes.data, mask.size, 4)
        steps.append(time.perf_counter() - start)
        guide.advance(t)
    coverage = {}
    for kw, schema in KEYWORDS.items():
        try:
            build_regex_from_schema(json.dumps(schema))
            coverage[kw] = "accepted"
        except Exception:
            coverage[kw] = "refused"
    return {"setup_s": setup, "compile_s": compile_s, "mask": stats(steps), "coverage": coverage}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    llama_cpp.llama_backend_init()
    _model, vocab = load_vocab()
    pieces = token_bytes(vocab)
    text = json.dumps(DOCUMENT)
    buf = (llama_cpp.llama_token * 512)()
    n = llama_cpp.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, 512, False, False)
    doc_tokens = list(buf[:n])
    results = {}
    for r in range(args.rounds):
        for name, fn in (
            ("llguidance", lambda: bench_llguidance(vocab, doc_tokens)),
            ("outlines-core", lambda: bench_outlines(vocab, pieces, doc_tokens)),
            ("llama.cpp GBNF", lambda: bench_llamacpp(vocab, doc_tokens)),
        ):
            try:
                results.setdefault(name, []).append(fn())
            except Exception as e:  # a candidate that cannot run is reported, not fatal
                results.setdefault(name, []).append({"error": repr(e)})
            print(f"round {r} {name}: {json.dumps(results[name][-1])[:300]}", flush=True)
    out = Path("bench-results")
    out.mkdir(exist_ok=True)
    (out / "grammar_engine_choice.json").write_text(json.dumps(results, indent=1))
    print(f"\n{len(doc_tokens)} document tokens; vocab {len(pieces)}")
    print("| engine | set-up s | small compile ms | realistic compile ms | mask mean ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        ok = [x for x in runs if "error" not in x]
        if not ok:
            print(f"| {name} | {runs[0]['error'][:80]} |")
            continue
        best = min(ok, key=lambda x: x["mask"]["mean_ms"])
        c = best["compile_s"]
        print(
            f"| {name} | {min(x['setup_s'] for x in ok):.2f} | {c['small'] * 1e3:.1f} | "
            f"{c['realistic'] * 1e3:.1f} | {best['mask']['mean_ms']:.3f} | "
            f"{best['mask']['p99_ms']:.3f} |"
        )
    print("\n| keyword | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    for kw in KEYWORDS:
        row = [runs[0].get("coverage", {}).get(kw, "-") for runs in results.values()]
        print(f"| {kw} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
