"""What the service tells its operators: the Prometheus series, the scrape-time collectors,
the per-request middleware (latency, status, errors by code) and the structured log lines."""
