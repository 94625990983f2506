"""transport.redis_identity: which Redis dataset a client talks to, Sentinel included."""

from __future__ import annotations

from redis import Redis
from redis.sentinel import Sentinel

from kumiko_jobs import transport


def _sentinel_client(service: str, db: int, ports: tuple[int, ...] = (26379, 26380)) -> Redis:
    # master_for connects lazily: nothing here reaches a server.
    sentinel = Sentinel([("10.0.0.1", p) for p in ports], db=db)
    return sentinel.master_for(service)


def test_sentinel_clients_are_one_dataset_per_service_and_database():
    same = transport.redis_identity(_sentinel_client("main", 3))
    assert transport.redis_identity(_sentinel_client("main", 3)) == same
    # Listed in another order: the same Sentinels.
    assert transport.redis_identity(_sentinel_client("main", 3, (26380, 26379))) == same
    assert transport.redis_identity(_sentinel_client("other", 3)) != same
    assert transport.redis_identity(_sentinel_client("main", 4)) != same


def test_plain_clients_by_address_and_database():
    a = transport.redis_identity(Redis(host="10.0.0.1", port=6379, db=0))
    assert a == transport.redis_identity(Redis(host="10.0.0.1", port=6379, db=0))
    assert a != transport.redis_identity(Redis(host="10.0.0.1", port=6379, db=1))
    assert a != transport.redis_identity(_sentinel_client("main", 0))
