"""Benchmarks of kumiko_jobs (run them, they are not tests): see bench/README.md."""

from __future__ import annotations
