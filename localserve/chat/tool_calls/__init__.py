"""Tool calls read out of a model's streamed text, one incremental parser per call format.

Each open model family writes its calls its own way; a parser is told the format (from
`models.toml`'s `tool_format`, or guessed from the chat template by `detect_tool_format`) and
fed the reply's text as it is sampled. It gives back events in the reply's order: `ContentDelta`
(text around the calls, passed through), `ToolCallStart` (index, id, function name) and
`ToolCallArguments` (a fragment of the arguments' JSON text, for OpenAI's streamed
`delta.tool_calls[i].function.arguments`); `finish()` gives the last events and every complete
`ParsedToolCall`.

The formats (FORMATS), and where they are written down:

- `hermes`: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several in a row
  for parallel calls. Hermes 2 Pro / 3, Qwen 2.5 (and Coder), QwQ, Qwen 3: NousResearch's
  Hermes-Function-Calling README and the Qwen function-calling docs (qwen.readthedocs.io,
  "Function Calling"); vLLM's `hermes` parser.
- `llama3`: `{"name": ..., "parameters": {...}}` at the start of the reply, or after
  `<|python_tag|>`, several separated by `;`. Llama 3.1, 3.2, 3.3: Meta's llama-models
  "prompt format" docs for 3.1 (JSON-based tool calling); vLLM's `llama3_json` parser, llama.cpp's
  `common/chat.cpp` (LLAMA_3_X). Llama 3.1's built-in tools (`<|python_tag|>brave_search.call(...)`)
  are not JSON and come out as text.
- `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral 7B v0.3, Nemo,
  Small 3.0/3.1, Large 2) and `[TOOL_CALLS]name[ARGS]{...}`, repeated for parallel calls, or
  `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}` as Mistral Small 3.2's template writes it (Small 3.2,
  Magistral, Devstral): mistral-common's tokenizer docs; vLLM's `mistral` parser. Mistral's
  templates refuse call ids that are not 9 letters and digits, so this format's ids are such.
- `gemma`: Gemma 3 has no tool tokens: a framework reads calls from the shape it prompted for.
  Google's "Function calling with Gemma" guide (ai.google.dev/gemma/docs/capabilities/
  function-calling) gives two prompts: a Python list of calls as the whole reply,
  `[name(arg=value, ...), other(...)]` (vLLM's `pythonic` parser, used with its Gemma 3 template,
  reads this), or a JSON object `{"name": ..., "parameters": {...}}` (what the community Gemma 3
  tool templates for Ollama ask for); Google's Gemma cookbook and agent guides wrap the Python
  calls in a fenced ```` ```tool_code ```` block instead. All three are read: the list and the
  JSON object opening the reply, the block anywhere. llama.cpp has no Gemma format of its own
  (it falls back to its generic JSON one). Python arguments must be keywords with literal
  values, read with `ast.literal_eval`, never run.

- `generic`: for a model whose chat template shows no call format: the prompt builder describes
  the tools in a system message and asks for `{"name": ..., "arguments": {...}}` as the whole
  reply; the reply is read for such objects opening it, bare or in a ```` ```json ```` block.
  llama.cpp's server does the same for such templates (its generic format). Chosen by
  `tool_format = "auto"` when the template shows none, or named.
- `deepseek`: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name` + newline +
  a ```` ```json ```` block of the arguments + `<｜tool▁call▁end｜>`, more calls, then
  `<｜tool▁calls▁end｜>`: DeepSeek V3, R1 and the R1 distills (their templates write this);
  vLLM's `deepseek_v3` parser, llama.cpp's DeepSeek R1 format.

Rules every format keeps:

- The events do not depend on how the text was split into deltas: feeding it whole or a
  character at a time gives the same content and the same calls.
- Text that only might start a call (a partial `<tool_c`, or a call not finished yet) is held
  back until it is clear; what is held is bounded by `max_call_chars` (a longer call is text).
- A call is given out only once it is whole and well-formed, so a call the model left
  unfinished, or wrote with bad JSON or an unknown shape, comes out as plain text, never an
  exception, and nothing given out has to be taken back. Its arguments therefore come in one
  `ToolCallArguments` fragment: the arguments re-encoded as JSON (json.dumps, non-ASCII kept).
- Whitespace between calls, before a first call opening the reply and after the last one
  ending it is dropped; all other text is given out as it came.

The special tokens some formats use (`<|python_tag|>`, `[TOOL_CALLS]`, `[ARGS]`: a parser's
`preserved_tokens`) must be in the text the parser is fed: the runner has to render those
The package, one module per format family plus what they share:

- `events.py`: the events a parser gives (`ContentDelta`, `ToolCallStart`, `ToolCallArguments`)
  and the complete `ParsedToolCall`.
- `scanning.py`: reading the held text: where a JSON value ends (resumable), a call object's
  name and arguments, whitespace.
- `parser.py`: `ToolCallParser`, the feed-and-hold machinery every format shares, and call ids.
- `hermes.py`: the `hermes` format (`<tool_call>` tags).
- `llama3.py`: the `llama3` format (JSON calls, `<|python_tag|>`).
- `mistral.py`: the `mistral` format (`[TOOL_CALLS]`, its list and `[ARGS]` forms, its ids).
- `gemma.py`: the `gemma` format (a Python list, a JSON object, a `tool_code` block).
- `pythonic.py`: Python call syntax read with `ast`, never run (the `gemma` format's calls).
- `deepseek.py`: the `deepseek` format (DeepSeek's tool-call tokens).
- `generic.py`: the `generic` format (JSON calls a system message asked for).
- `choosing.py`: the formats by name, guessed from a chat template, and a parser for one reply.

Tested in tests/unit/chat/test_tool_calls.py and tests/unit/chat/test_scripted_replies.py.
"""

from __future__ import annotations

from localserve.chat.tool_calls.choosing import (
    FORMATS,
    PARSERS,
    choose_tool_format,
    detect_tool_format,
    new_tool_parser,
)
from localserve.chat.tool_calls.events import (
    ContentDelta,
    ParsedToolCall,
    ToolCallArguments,
    ToolCallsFinished,
    ToolCallStart,
    ToolEvent,
)
from localserve.chat.tool_calls.parser import ToolCallParser

__all__ = [
    "FORMATS",
    "PARSERS",
    "ContentDelta",
    "ParsedToolCall",
    "ToolCallArguments",
    "ToolCallParser",
    "ToolCallStart",
    "ToolCallsFinished",
    "ToolEvent",
    "choose_tool_format",
    "detect_tool_format",
    "new_tool_parser",
]
