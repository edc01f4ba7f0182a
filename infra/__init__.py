"""Where the platform runs: the native Kafka broker, ClickHouse migrations, Grafana provisioning."""
