"""tests/pages.py: a page's HTML without its CSRF tokens reads the same on every response."""

from __future__ import annotations

from django.template import engines
from django.test import RequestFactory

from tests.pages import CSRF_PLACEHOLDER, without_csrf_tokens

# Two forms, as the admin's pages have (the logout form and the list's own).
PAGE = (
    '<form action="/logout/" method="post">{% csrf_token %}<button>Log out</button></form>'
    '<form method="post">{% csrf_token %}<p>rows of t1</p></form>'
)


def _rendered(times: int) -> list[str]:
    template = engines["django"].from_string(PAGE)
    return [template.render({}, RequestFactory().get("/")) for _ in range(times)]


def test_every_response_reads_the_same_without_its_tokens() -> None:
    pages = _rendered(300)
    assert len(set(pages)) == 300  # each response has tokens of its own ...
    assert all(page.count("csrfmiddlewaretoken") == 2 for page in pages)
    # ... and nothing else differs, so no short string can be in one page by chance.
    assert {without_csrf_tokens(page) for page in pages} == {
        f'<form action="/logout/" method="post">{CSRF_PLACEHOLDER}<button>Log out</button></form>'
        f'<form method="post">{CSRF_PLACEHOLDER}<p>rows of t1</p></form>'
    }


def test_an_input_with_its_attributes_in_another_order_loses_its_token_too() -> None:
    html = '<input value="abcT2xyz" name=\'csrfmiddlewaretoken\' type="hidden"><p>t1</p>'
    assert without_csrf_tokens(html) == f"{CSRF_PLACEHOLDER}<p>t1</p>"
    assert without_csrf_tokens("<p>t2</p>") == "<p>t2</p>"  # the page itself is kept
