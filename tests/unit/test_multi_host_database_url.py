"""A failover pair in DATABASE_URL: libpq's multi-host form, as Django and psycopg take it.

``postgres://u@h1:p1,h2:p2/db?target_session_attrs=read-write`` must become HOST "h1,h2", PORT
"p1,p2" and OPTIONS {"target_session_attrs": "read-write"} (Django hands all three to psycopg
as they are; libpq takes the first host that accepts writes). Before, ``urlparse().port``
raised on the comma (every process using the settings failed at import), and the query string
was dropped. tests/integration/test_failover_postgres.py runs workers on such a URL.
"""

from __future__ import annotations

from example_project import devservices
from example_project.settings import _database


def test_one_host_is_as_before() -> None:
    settings = _database("postgres://kumiko:s%40cret@db.example:6543/shop")
    assert (settings["HOST"], settings["PORT"]) == ("db.example", "6543")
    assert settings["USER"] == "kumiko"
    assert settings["PASSWORD"] == "s@cret" and settings["NAME"] == "shop"
    assert "OPTIONS" not in settings
    assert _database("postgres://127.0.0.1/x")["PORT"] == "5432"


def test_two_hosts_and_libpq_parameters() -> None:
    settings = _database(
        "postgres://postgres@127.0.0.1:5433,127.0.0.1:5434/kumiko"
        "?target_session_attrs=read-write&connect_timeout=3"
    )
    assert settings["HOST"] == "127.0.0.1,127.0.0.1"
    assert settings["PORT"] == "5433,5434"
    assert settings["NAME"] == "kumiko" and settings["USER"] == "postgres"
    assert settings["OPTIONS"] == {"target_session_attrs": "read-write", "connect_timeout": "3"}


def test_hosts_without_ports_and_ipv6() -> None:
    settings = _database("postgres://u@[::1]:5433,replica.example/x")
    assert (settings["HOST"], settings["PORT"]) == ("::1,replica.example", "5433,5432")


def test_devservices_reads_the_first_host_of_a_pair() -> None:
    url = "postgres://postgres@127.0.0.1:5433,127.0.0.1:5434/kumiko?target_session_attrs=read-write"
    assert devservices._host_port(url, 5432) == ("127.0.0.1", 5433)
    assert devservices._several_hosts(url)
    assert not devservices._several_hosts("postgres://postgres@127.0.0.1:5433/kumiko")
    assert devservices._host_port("redis://127.0.0.1:6380/0", 6379) == ("127.0.0.1", 6380)
