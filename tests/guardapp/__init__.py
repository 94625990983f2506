"""Test-only tenant app for the DB guard suites: tables to attack, jobs that attack them."""

from __future__ import annotations
