"""Acceptance: the shared PostgreSQL store across real sidecar processes, and store outages."""
