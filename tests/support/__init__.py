"""Test support shared by unit and end-to-end tests (not collected as tests)."""
