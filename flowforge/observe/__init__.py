"""What processes count and trace (Prometheus series, OpenTelemetry spans); they observe the
store's units of work and decide nothing."""
