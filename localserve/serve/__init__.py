"""The server: its lifecycle, admission, prompt building, transport limits, and one subpackage
per front-end (websocket/, openai/) plus the chat page.
"""
