"""The wire contracts, msgspec only:

- `snapshot.py`: the engine's snapshot schema: what the engine says about itself.
- `frames.py`: the websocket frames the server, the clients and the monitor share.
"""
