"""State stores behind small protocols (grants, idempotency, nonces).

SQLite or memory by default; a later backend (Redis) changes no policy code.
"""
