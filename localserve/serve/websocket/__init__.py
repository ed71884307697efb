"""The websocket front-end: one `Connection` per socket and its bounded outbox."""
