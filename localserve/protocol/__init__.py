"""The wire contracts, msgspec only: the engine's snapshot schema (snapshot.py) and the
websocket frames (frames.py).
"""
