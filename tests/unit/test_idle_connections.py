"""core.idle_connections: which idle connection counts as dead, on a fake psycopg connection
over a real socket pair (the server's end is the other socket). The real thing, PostgreSQL
ending a kept session, is tests/integration/test_dead_connections.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from psycopg.pq import ConnStatus, TransactionStatus

from kumiko_jobs.core import idle_connections


@dataclass
class FakePGconn:
    socket: int
    status: ConnStatus = ConnStatus.OK
    transaction_status: TransactionStatus = TransactionStatus.IDLE


@dataclass
class FakeRaw:
    pgconn: FakePGconn
    closed: bool = False
    broken: bool = False


@dataclass
class FakeWrapper:
    connection: Any
    in_atomic_block: bool = False
    closes: list[str] = field(default_factory=list)

    def close(self) -> None:
        self.closes.append("close")
        self.connection = None


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    client, server = socket.socketpair()
    yield client, server
    client.close()
    server.close()


def test_a_quiet_idle_connection_is_alive(pair):
    client, _ = pair
    assert idle_connections.died(FakeRaw(FakePGconn(client.fileno()))) is False


def test_a_word_from_the_server_while_idle_means_it_ended_the_session(pair):
    client, server = pair
    server.sendall(b"E...FATAL terminating connection due to administrator command")
    assert idle_connections.died(FakeRaw(FakePGconn(client.fileno()))) is True


def test_a_hang_up_without_a_word_is_seen_too(pair):
    client, server = pair
    server.close()
    assert idle_connections.died(FakeRaw(FakePGconn(client.fileno()))) is True


@pytest.mark.parametrize(
    "state", [TransactionStatus.INTRANS, TransactionStatus.ACTIVE, TransactionStatus.INERROR]
)
def test_a_connection_that_is_not_idle_is_not_judged(pair, state):
    client, server = pair
    server.sendall(b"a reply to a statement in flight")
    assert (
        idle_connections.died(FakeRaw(FakePGconn(client.fileno(), transaction_status=state)))
        is False
    )


@pytest.mark.parametrize(
    "raw",
    [
        {"closed": True},
        {"broken": True},
        {"pgconn": FakePGconn(-1, status=ConnStatus.BAD)},
    ],
    ids=["closed", "broken", "bad_status"],
)
def test_what_psycopg_already_knows_is_dead(pair, raw):
    client, _ = pair
    fields = {"pgconn": FakePGconn(client.fileno()), **raw}
    assert idle_connections.died(FakeRaw(**fields)) is True


def test_close_if_died_closes_only_a_dead_connection_outside_atomic(pair):
    client, server = pair
    alive = FakeWrapper(FakeRaw(FakePGconn(client.fileno())))
    assert idle_connections.close_if_died(alive) is False
    assert alive.closes == []
    server.sendall(b"bye")
    in_atomic = FakeWrapper(FakeRaw(FakePGconn(client.fileno())), in_atomic_block=True)
    assert idle_connections.close_if_died(in_atomic) is False  # its transaction's place stays
    dead = FakeWrapper(FakeRaw(FakePGconn(client.fileno())))
    assert idle_connections.close_if_died(dead) is True
    assert dead.closes == ["close"] and dead.connection is None
    assert idle_connections.close_if_died(FakeWrapper(None)) is False  # never connected
