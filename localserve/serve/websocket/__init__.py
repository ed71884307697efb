"""The websocket front-end: one `Connection` per socket, its bounded outbox, and `Connections`,
the registry of them all (their cap, the welcome, the stats frame they share)."""
