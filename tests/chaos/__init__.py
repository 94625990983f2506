"""Chaos helpers of the test suite: real worker processes with chosen settings, a TCP proxy."""

from __future__ import annotations
