"""The envelope's signer (core/signer.py) signs as Django's ``Signer`` does, byte for byte,
and follows a change of the secret: settings only, no database, no Redis."""

from __future__ import annotations

import pytest
from django.core import signing
from django.test import override_settings

from kumiko_jobs.core.envelope import Envelope as Env
from kumiko_jobs.core.envelope import decode, encode
from kumiko_jobs.core.signer import signer_for

SALT = "kumiko_jobs.envelope.v2"


@pytest.mark.parametrize("value", ["", "x", '{"a":"é","b":[1,2]}', "a" * 5000])
def test_signatures_are_djangos(value: str) -> None:
    django = signing.Signer(salt=SALT, algorithm="sha256")
    assert signer_for(SALT).sign(value) == django.sign(value)
    assert signer_for(SALT).unsign(django.sign(value)) == value


def test_a_changed_secret_makes_a_new_signer() -> None:
    before = signer_for(SALT).sign("payload")
    with override_settings(SECRET_KEY="another-secret-for-this-test-only-0123456789"):
        changed = signer_for(SALT).sign("payload")
        assert changed == signing.Signer(salt=SALT, algorithm="sha256").sign("payload")
    assert changed != before
    assert signer_for(SALT).sign("payload") == before


def test_a_message_signed_with_a_fallback_secret_still_decodes() -> None:
    env = Env(job="a.b", schema="t1", kwargs={"n": 1}, run_id="0" * 31 + "1")
    old = "the-old-secret-of-this-test-only-0123456789abcdef"
    with override_settings(SECRET_KEY=old):
        message = encode(env)
    with override_settings(SECRET_KEY_FALLBACKS=[old]):
        assert decode(message) == env
    with pytest.raises(Exception, match="bad signature"):
        decode(message)
