"""notes package."""
