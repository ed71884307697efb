"""The server: its lifecycle, admission, prompt building, transport limits, and one subpackage
per front-end plus the chat page.

- `serving.py`: `serving()`: a model served, from a config to a listening server and back.
- `server.py`: the server: its models on one port, from listening to a graceful shutdown.
- `app.py`: the ASGI app on the one port: websockets to a `Connection`, HTTP to Starlette.
- `transport.py`: bounded connections: uvicorn's protocols with localserve's limits.
- `health.py`: `GET /healthz` and `GET /metrics`.
- `cors.py`: CORS for the HTTP APIs, for the origins `allowed_origins` lists.
- `door.py`: the front-ends' seam: what a front-end may ask of the server (`Frontdoor`).
- `model_door.py`: every model's front door, the default's too (`ModelDoor`).
- `admission.py`: who and what the server lets in, whichever front-end a chat came through.
- `authentication.py`: token checks, and the throttle on failed ones.
- `model_waits.py`: a request waiting for its model to load; warming a model.
- `request_counts.py`: the requests in flight and waiting, in all and per user.
- `trusted_proxies.py`: the people behind a trusted front-end's one API key.
- `pool.py`: the models served: one slot per model, loaded when asked for, evicted when idle.
- `swaps.py`: each person's swaps of models others use, budgeted: nobody churns them.
- `pulling.py`: a model pulled while serving (Ollama's /api/pull): `localserve pull`, then served.
- `prompt.py`: the prompt builder: chats to prompt text, then to tokens.
- `embedding_inputs.py`: an embedding request's inputs bounded, its vectors cut to size.
- `routing.py`: engine events back to their request's sink, on the server's loop.
- `snapshots.py`: the engine's snapshots, shared: however many ask, the engine makes one.
- `tool_use.py`: a chat request's tools and thinking switch, and the reading of its reply.
- `http_body.py`: an HTTP request's JSON body, bounded in bytes and time, then decoded.
- `http_reply.py`: an HTTP reply's sink and ASGI response, watched for a client that leaves.
- `http_embed.py`: an embedding request's sink and whole reply, on http_reply's.
- `page.py`: the chat page: static files in the package (web/), served at `/`.
- `websocket/`: the websocket front-end.
- `openai/`: the OpenAI-compatible HTTP API under `/v1`.
- `ollama/`: the Ollama API under `/api`.
- `anthropic/`: the Anthropic Messages API under `/v1/messages`.
- `responses/`: OpenAI's Responses API under `/v1/responses`, its responses kept per person.
"""
