"""Who may act in the console. Without a token (or with --read-only) nobody: the console
only shows. With one, a person signs in with it and gets a session cookie (HttpOnly,
SameSite=Strict, signed with a key derived from the token, so changing the token ends every
session and replicas agree without shared state); every action is a POST carrying a CSRF
token bound to that session. A script may instead send `Authorization: Bearer <token>`,
which a browser never sends by itself, so it needs no CSRF token. Tokens, signatures and
CSRF tokens are compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

SESSION_COOKIE = "obsq_session"
SESSION_SECONDS = 12 * 3600


class Auth:
    def __init__(self, token: str | None, read_only: bool = False) -> None:
        self._token = (token or "").encode()
        self.can_act = bool(token) and not read_only
        self._key = hashlib.sha256(b"obsq-ui-session\0" + self._token).digest()

    def token_ok(self, given: str | None) -> bool:
        """The operator's token, compared in constant time."""
        return self.can_act and hmac.compare_digest((given or "").encode(), self._token)

    def bearer_ok(self, authorization: str | None) -> bool:
        scheme, _, given = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and self.token_ok(given.strip())

    def new_session(self) -> str:
        body = f"{int(time.time()) + SESSION_SECONDS}.{secrets.token_hex(16)}"
        return f"{body}.{self._sign(body)}"

    def session_ok(self, session: str | None) -> bool:
        if not self.can_act or not session:
            return False
        body, _, signature = session.rpartition(".")
        expires = body.partition(".")[0]
        return (hmac.compare_digest(signature.encode(), self._sign(body).encode())
                and expires.isdigit() and int(expires) > time.time())

    def csrf_token(self, session: str) -> str:
        return self._sign("csrf\0" + session)

    def csrf_ok(self, session: str | None, given: str | None) -> bool:
        return self.session_ok(session) and hmac.compare_digest(
            (given or "").encode(), self.csrf_token(session or "").encode())

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()
