"""localserve: a local, multi-user LLM chat server with continuous batching.

The packages and modules, by layer (docs/architecture.md draws them):

- `__main__.py`: `python -m localserve`, the same command line as the `localserve` script.
- `cli/`: the command line, one module per command.
- `bench/`: the load generator, the sweep, the engine benchmark, and what benchmarks share.
- `serve/`: the server: admission, the pool of models, prompts, transport, the front-ends.
- `engine_process/`: the engine in a process of its own, watched.
- `runners/`: the tensor work: llama.cpp, and a fake.
- `chat/`: what a chat means to a model: templates, tool calls, reasoning, constraints.
- `engine/`: the core, no I/O: sequences, KV cells, the scheduler, the step loop.
- `websocket_client.py`: a small asyncio client for the websocket protocol.
- `ops/`: what an operator runs the server with: usage, quotas, users, metrics.
- `protocol/`: the wire contracts, msgspec only.
- `config.py`: models.toml read into validated msgspec Structs.
"""

__version__ = "0.1.0"
