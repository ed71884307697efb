"""What a chat means to a model: its chat template (Jinja, as the model's authors wrote it), the
tool calls and reasoning in its replies, the grammars that constrain them, and long chats made to
fit its context. Pure logic over text and token counts: no sockets, no llama.cpp context; the
server (serve/) uses it to build prompts and read replies."""
