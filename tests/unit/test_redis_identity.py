"""transport.redis_identity: which Redis dataset a client talks to, Sentinel included; and the
cached queues, dropped when RQ_QUEUES changes."""

from __future__ import annotations

from django.test import override_settings
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


def test_an_override_of_rq_queues_drops_the_cached_queues():
    """The transport's own setting_changed receiver: a queue built before the override does not
    survive it (clients connect lazily: nothing here reaches a server)."""
    before = transport.get_queue("default")
    with override_settings(RQ_QUEUES={"default": {"URL": "redis://10.0.0.9:6379/5"}}):
        during = transport.get_queue("default")
        assert during is not before
        assert during.connection.connection_pool.connection_kwargs["host"] == "10.0.0.9"
    assert transport.get_queue("default") is not during
