"""OAUTHBEARER tokens for kafka-python: OIDC client credentials, fetched from the token endpoint and cached.

librdkafka (`sasl.oauthbearer.method=oidc`) and Kafka's Java client (OAuthBearerLoginCallbackHandler)
fetch their tokens themselves; kafka-python only asks a token provider object for one at each
login (kafka.token_provider). This is where that object's tokens come from, for the same connection
settings, with the standard library only (DAG parsing imports kafka.settings): an RFC 6749 client-credentials
grant (client id and secret in an HTTP Basic header, as the Java client and librdkafka send them),
one token per (endpoint, client, scope) reused by every client of the process until shortly
before it expires.

An endpoint that refuses (a wrong client id or secret, an unknown scope) or cannot be reached is a
ConfigurationError naming the endpoint and the setting to fix: no Kafka client can log in without
a token, and retrying the same settings cannot get one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import NoReturn

from airflow_exactly_once.core.errors import ConfigurationError

TOKEN_TIMEOUT_S = 10.0
# A token is fetched anew this long before it expires, so a login never presents one that lapses mid-handshake.
EXPIRY_MARGIN_S = 30.0
# When neither `expires_in` nor the JWT's `exp` says how long a token lives.
DEFAULT_LIFETIME_S = 300.0


@dataclass(frozen=True)
class ClientCredentials:
    """Who asks the token endpoint for a token: the OIDC client of the connection's sasl.oauthbearer.* settings."""

    token_endpoint: str
    client_id: str
    client_secret: str
    scope: str = ""
    origin: str = "kafka_config"

    def __repr__(self) -> str:  # never the secret, whoever prints this
        return (f"ClientCredentials(token_endpoint={self.token_endpoint!r}, client_id={self.client_id!r}, "
                f"scope={self.scope!r}, origin={self.origin!r})")

    @property
    def cache_key(self) -> tuple[str, str, str, str]:
        """The token's identity; a changed secret makes a new one (the digest keeps the secret out of the key)."""
        digest = hashlib.sha256(self.client_secret.encode()).hexdigest()
        return self.token_endpoint, self.client_id, self.scope, digest


@dataclass(frozen=True)
class AccessToken:
    value: str
    expires_at: float  # time.monotonic() clock

    def fresh(self, now: float) -> bool:
        return now < self.expires_at - EXPIRY_MARGIN_S


_cache: dict[tuple[str, str, str, str], AccessToken] = {}
_lock = threading.Lock()


def access_token(credentials: ClientCredentials) -> str:
    """A valid token for `credentials`: the cached one, or a new one from the token endpoint."""
    with _lock:
        cached = _cache.get(credentials.cache_key)
        if cached is not None and cached.fresh(time.monotonic()):
            return cached.value
        token = fetch_token(credentials)
        _cache[credentials.cache_key] = token
        return token.value


def fetch_token(credentials: ClientCredentials, timeout_s: float = TOKEN_TIMEOUT_S) -> AccessToken:
    """One client-credentials grant; a refusal or an unreachable endpoint is a ConfigurationError saying what to fix."""
    form = {"grant_type": "client_credentials", **({"scope": credentials.scope} if credentials.scope else {})}
    basic = base64.b64encode(f"{_form_quote(credentials.client_id)}:{_form_quote(credentials.client_secret)}"
                             .encode()).decode()
    request = urllib.request.Request(credentials.token_endpoint, data=urllib.parse.urlencode(form).encode(),
                                     headers={"Authorization": f"Basic {basic}", "Accept": "application/json",
                                              "Content-Type": "application/x-www-form-urlencoded"})
    where = f"the OAuth token endpoint {credentials.token_endpoint} (sasl.oauthbearer.token.endpoint.url of " \
            f"{credentials.origin})"
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = json.loads(response.read().decode() or "{}")
    except urllib.error.HTTPError as exc:
        said = _error_of(exc)
        if exc.code in (400, 401, 403):
            _refused(where, credentials, f"HTTP {exc.code} {said}")
        raise ConfigurationError(
            f"{where} answered HTTP {exc.code} {said} to client {credentials.client_id!r}: check that the URL is the "
            "provider's token endpoint (not its issuer or JWKS URL) and that the provider is up") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigurationError(
            f"{where} cannot be reached ({reason}): set sasl.oauthbearer.token.endpoint.url to the OIDC provider's "
            "token endpoint (https://.../token), reachable from the Airflow workers and the Spark executors") from None
    token = body.get("access_token") if isinstance(body, dict) else None
    if not token:
        fields = sorted(body) if isinstance(body, dict) else type(body).__name__
        raise ConfigurationError(f"{where} answered without an access_token (fields: {fields}): check that the URL is "
                                 "the provider's token endpoint")
    lifetime = _lifetime(body, token)
    return AccessToken(str(token), started + lifetime)


def _refused(where: str, credentials: ClientCredentials, said: str) -> NoReturn:
    scope = f" and that scope {credentials.scope!r} is one it may ask for" if credentials.scope else ""
    raise ConfigurationError(
        f"{where} refused the client credentials of client {credentials.client_id!r} ({said}): fix "
        f"sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret in {credentials.origin}{scope}; retrying with "
        "the same credentials cannot succeed")


def _error_of(exc: urllib.error.HTTPError) -> str:
    """The OAuth error code and description of a refusal (RFC 6749 section 5.2), shortened."""
    try:
        body = json.loads(exc.read().decode() or "{}")
    except (ValueError, OSError):
        return ""
    if not isinstance(body, dict):
        return ""
    text = ": ".join(str(body[k]) for k in ("error", "error_description") if body.get(k))
    return text[:200]


def _lifetime(body: dict, token: str) -> float:
    """Seconds the token lives: `expires_in`, else the JWT's `exp` claim (read, not verified: the broker verifies)."""
    if isinstance(body.get("expires_in"), (int, float)) or str(body.get("expires_in", "")).isdigit():
        return float(body["expires_in"])
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"]) - time.time()
    except (IndexError, KeyError, TypeError, ValueError):
        return DEFAULT_LIFETIME_S


def _form_quote(value: str) -> str:
    """RFC 6749 section 2.3.1: client id and secret are form-encoded before they go into the Basic header."""
    return urllib.parse.quote_plus(value)
