"""Grafana as code for the rollout telemetry: dashboards, alert rules and provisioning, built and checked here.

``python -m dashboards`` (or ``rollout grafana build``) writes ``dashboards/generated/*.json`` and
``infra/grafana/provisioning/``; ``rollout grafana push`` sends the same objects to a running Grafana.
"""
