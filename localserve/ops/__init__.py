"""What an operator runs the server with: the usage record (usage.py, its database
usage_database.py, access_log.py) and quotas (quotas.py), users and tokens, Prometheus metrics.
"""
