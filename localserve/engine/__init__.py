"""The engine core: sequences, the KV-cell pool, the scheduler, the step loop, events and
metrics. No asyncio, no sockets, no llama.cpp: a `Runner` does the tensor work.
"""
