"""middleware package."""
