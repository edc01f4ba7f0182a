"""Command line, settings and error root of the rollout telemetry platform."""
