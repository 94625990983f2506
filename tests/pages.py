"""A page's HTML as a test compares it: without the CSRF tokens, the part of a rendered page
that differs on every response.

Django masks its CSRF secret afresh for every response: each form's hidden
``csrfmiddlewaretoken`` input (the admin's logout form in its header included) carries 64
random letters and digits. A check that a short string (a schema's name, "t2") appears nowhere
on a page then fails by chance whenever the token happens to spell it: for two characters about
one page in 60 (tests/integration/test_workflows_admin.py failed so, in any order).
"""

from __future__ import annotations

import re

# The whole input, whatever the order of its attributes.
_CSRF_INPUT = re.compile(r"<input\b[^>]*\bname=[\"']csrfmiddlewaretoken[\"'][^>]*>")
CSRF_PLACEHOLDER = '<input type="hidden" name="csrfmiddlewaretoken">'


def without_csrf_tokens(html: str) -> str:
    """``html`` with each CSRF token's input replaced by the same token-less input."""
    return _CSRF_INPUT.sub(CSRF_PLACEHOLDER, html)
