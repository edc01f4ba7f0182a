"""Errors of the dashboards package: building, expanding queries, and pushing to Grafana."""

from __future__ import annotations

from rollout.errors import ConfigurationError, PermanentError, RolloutError, ServiceUnavailable


class DashboardError(RolloutError):
    """Root of the errors raised by the dashboards package."""


class MacroError(DashboardError, PermanentError):
    """A query uses a macro or variable wrongly (missing arguments, unbalanced parentheses)."""


class GrafanaUnreachable(DashboardError, ServiceUnavailable):
    """Grafana did not answer (connection refused, DNS, TLS or timeout)."""


class GrafanaAuthError(DashboardError, ConfigurationError):
    """Grafana refused the credentials (401) or the permission (403)."""


class GrafanaRejected(DashboardError, PermanentError):
    """Grafana answered but refused a request (bad input, conflict, server error)."""
