"""The Textual monitor and the terminal chat client (next issues)."""
