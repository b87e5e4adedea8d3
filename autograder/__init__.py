"""Distributed test runner, communication ledger and comparison helpers for the course."""
