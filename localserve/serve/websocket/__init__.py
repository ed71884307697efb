"""The websocket front-end: one `Connection` per socket, its bounded outbox, and `Connections`,
the registry of them all (their cap, the welcome, the stats frame they share).

- `connection.py`: one websocket connection: its user, its requests, its outbox.
- `connections.py`: the server's connections together: their cap, what they share.
- `conversations.py`: a connection's conversation frames: the person's saved conversations.
- `outbox.py`: the frames waiting for one websocket, bounded in frames and in bytes.
"""
