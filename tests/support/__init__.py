"""What the tests share: the fake-runner harness, the servers on loopback (fake and live), the
clients that talk to them, and small readers of what they answer. Tests import from here,
never from one another or from a conftest."""
