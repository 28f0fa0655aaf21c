"""State stores behind small protocols (grants, idempotency, nonces); SQLite or memory by default."""
