"""What a chat means to a model: its chat template (Jinja, as the model's authors wrote it), the
tool calls and reasoning in its replies, the grammars that constrain them, and long chats made to
fit its context. Pure logic over text and token counts: no sockets, no llama.cpp context; the
server (serve/) uses it to build prompts and read replies.

- `templates.py`: Hugging Face Jinja chat templates, rendered in a bounded sandbox.
- `messages.py`: a chat's messages as the prompt builder takes them, tool calls included.
- `fitting.py`: long chats made to fit the context, cut in steps that keep a cached prefix.
- `tools.py`: the tools a request offers, its tool choice, the grammar that forces a call.
- `tool_calls/`: tool calls read out of the streamed reply, one parser per call format.
- `reasoning.py`: a thinking model's reasoning split from its answer as the reply streams.
- `reply.py`: one reply read as it streams: reasoning, then tool calls, as one list of events.
- `formats.py`: which call and reasoning formats a model writes, read once.
- `constraints.py`: structured output: a `response_format` or grammar checked and compiled.
"""
