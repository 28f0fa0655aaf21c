"""What the server tells its operators: structured logs, the audit trail (sinks and
events) and telemetry (metrics, traces)."""
