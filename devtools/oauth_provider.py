"""A small OIDC provider for tests: client-credentials tokens (RS256 JWTs) and the JWKS that verifies them.

What Kafka's OAUTHBEARER support needs from an identity provider (Keycloak, Azure AD, Okta, ...),
and nothing more, in a thread of the test process on 127.0.0.1:

* `POST /token`: an RFC 6749 client-credentials grant. The client authenticates with HTTP Basic
  (client id and secret form-encoded, as Kafka's Java client sends them) or with `client_id` and
  `client_secret` in the form (librdkafka's choice on some releases); a client it does not know,
  or a wrong secret, gets 401 `invalid_client`. The token's `sub` is the client id (the broker's
  principal is then `User:<client id>`), with `iss`, `aud`, `iat`, `exp` and `scope`.
* `GET /jwks`: the public key, which the broker's OAuthBearerValidatorCallbackHandler fetches
  (`sasl.oauthbearer.jwks.endpoint.url`) to verify every token's signature.

`token_requests` counts the grants it answered, so a test can see that clients reuse tokens.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote_plus

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from devtools.http_thread import ThreadedHttpServer
from devtools.ports import reserve_port

AUDIENCE = "kafka"


class LocalOAuthProvider(ThreadedHttpServer):
    """Issues tokens to the clients in `clients` (client id -> secret); `with` starts and stops it."""

    def __init__(self, clients: dict[str, str], token_lifetime_s: int = 3600, port: int = 0) -> None:
        self.clients = dict(clients)
        self.token_lifetime_s = token_lifetime_s
        self.port = port or reserve_port()
        self.key_id = uuid.uuid4().hex[:12]
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.token_requests = 0

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token_url(self) -> str:
        return f"{self.issuer}/token"

    @property
    def jwks_url(self) -> str:
        return f"{self.issuer}/jwks"

    def jwks(self) -> dict:
        key = json.loads(RSAAlgorithm.to_jwk(self._key.public_key()))
        return {"keys": [{**key, "kid": self.key_id, "use": "sig", "alg": "RS256"}]}

    def issue(self, client_id: str, scope: str = "") -> str:
        """A signed token for `client_id` (what /token answers it)."""
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": client_id, "aud": AUDIENCE, "iat": now,
                  "exp": now + self.token_lifetime_s, "scope": scope, "client_id": client_id}
        return jwt.encode(claims, self._key, algorithm="RS256", headers={"kid": self.key_id})

    thread_name = "oauth-provider"

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet: tests read their own assertions
                pass

            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/jwks":
                    self._answer(200, provider.jwks())
                else:
                    self._answer(404, {"error": "not_found"})

            def do_POST(self) -> None:
                if self.path.split("?")[0] != "/token":
                    self._answer(404, {"error": "not_found"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
                client_id, secret = _basic(self.headers.get("Authorization", ""))
                client_id = client_id or form.get("client_id", "")
                secret = secret if secret is not None else form.get("client_secret")
                if form.get("grant_type") != "client_credentials":
                    self._answer(400, {"error": "unsupported_grant_type"})
                elif client_id not in provider.clients or provider.clients[client_id] != secret:
                    self._answer(401, {"error": "invalid_client", "error_description": "unknown client or secret"})
                else:
                    provider.token_requests += 1
                    self._answer(200, {"access_token": provider.issue(client_id, form.get("scope", "")),
                                       "token_type": "Bearer", "expires_in": provider.token_lifetime_s})

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _basic(header: str) -> tuple[str, str | None]:
    """(client id, secret) of an HTTP Basic header, form-decoded (RFC 6749 section 2.3.1); ("", None) without one."""
    if not header.lower().startswith("basic "):
        return "", None
    try:
        user, _, secret = base64.b64decode(header[6:].strip()).decode().partition(":")
    except ValueError:
        return "", None
    return unquote_plus(user), unquote_plus(secret)
