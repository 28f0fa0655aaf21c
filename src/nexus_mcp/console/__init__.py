"""The operator console: approvals inbox, upstream pins, access, audit, health (issue 26)."""
