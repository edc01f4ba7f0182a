"""Test support: the service stack (broker, worker processes) used by integration and e2e tests."""
