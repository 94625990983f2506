"""The envelope's signer: Django's ``Signer``, with its HMAC key derived once per secret.

``django.core.signing.Signer`` reads the settings, checks its separator and derives its HMAC
key (a SHA-256 of the salt and ``SECRET_KEY``) again for every signer made and every
signature. Made per message, as the envelope did, that was a fifth of a bulk enqueue's time
(bench/README.md, "`enqueue_many` at 10,000 runs/s"). One signer per salt is kept here, made
again when ``SECRET_KEY`` or ``SECRET_KEY_FALLBACKS`` change (``override_settings``), and its
signatures are Django's byte for byte (tests/unit/test_signer.py); a fallback key (an old
secret, while unsigning) takes Django's own path.
"""

from __future__ import annotations

import hashlib
import hmac

from django.core import signing
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.encoding import force_bytes


class KeyedSigner(signing.Signer):
    """A ``Signer`` (sha256, ``:``) whose own key's HMAC is set up once."""

    def __init__(self, salt: str) -> None:
        super().__init__(salt=salt, algorithm="sha256")
        derived = hashlib.sha256(force_bytes(f"{salt}signer") + force_bytes(self.key))
        self._keyed = hmac.new(derived.digest(), digestmod=hashlib.sha256)

    def signature(self, value: str | bytes, key: str | bytes | None = None) -> str:
        if key is not None and key != self.key:
            return str(super().signature(value, key))
        mac = self._keyed.copy()
        mac.update(force_bytes(value))
        return signing.b64_encode(mac.digest()).decode()


_signers: dict[str, KeyedSigner] = {}


def signer_for(salt: str) -> KeyedSigner:
    """The signer of ``salt`` for the current secret."""
    signer = _signers.get(salt)
    if signer is None:
        signer = _signers[salt] = KeyedSigner(salt)
    return signer


@receiver(setting_changed)
def _forget_signers(*, setting: str, **_: object) -> None:
    if setting in {"SECRET_KEY", "SECRET_KEY_FALLBACKS"}:
        _signers.clear()
