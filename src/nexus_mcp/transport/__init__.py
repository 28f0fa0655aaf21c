"""Transports: stdio and streamable HTTP, the ASGI guards in front of the app (wire
errors, routing headers) and the HTTP worker processes."""
