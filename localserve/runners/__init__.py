"""The runners that do the engine's tensor work: llama.cpp (with its sampling, placement,
RPC workers and model resolution) and the fake used to test the engine without a model.
"""
