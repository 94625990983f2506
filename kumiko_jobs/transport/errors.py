"""Redis's errors, under the names the rest of kumiko catches.

Only the transport imports ``redis``; the worker still has to tell a lost Redis (keep the runs
alive, reconnect) from other failures, so it catches these through the transport's face.
"""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["RedisConnectionError", "RedisError", "RedisTimeoutError"]
