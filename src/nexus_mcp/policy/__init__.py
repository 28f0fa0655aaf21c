"""Pure policy: decisions as plain functions and value objects. Nothing here imports FastMCP."""
