"""What an operator runs the server with: the usage record and quotas, users and tokens,
Prometheus metrics.
"""
