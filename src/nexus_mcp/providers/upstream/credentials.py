"""Per-caller credentials of an HTTP upstream (issue 27): obtained for the caller, never
the caller's own token.

- ``per_principal``: the bearer configured (by reference) for the principal's subject; a
  principal without one is refused, never served with the gateway's own credential.
- ``token_exchange``: RFC 8693 at the identity provider's token endpoint, with the
  caller's verified access token (``calls.current_subject_token``, bound by the identity
  layer on HTTP) as the subject token; a caller without one (stdio, in-process, an
  unverified dev caller) is refused. The exchanged token is kept per (caller session
  key, upstream) until shortly before it expires (``policy/token_exchange.py``).

The exchange is Authlib's ``AsyncOAuth2Client.fetch_token`` (the OAuth client the console
sign-in already uses, maintained, and FastMCP's own dependency): it does the client
authentication (``client_secret_basic`` with RFC 6749's form-encoding of the id and
secret, or ``client_secret_post``) and reads the token response and its OAuth error.
Its HTTP client gets the upstream's bounded transport (a token response is read up to
``MAX_ANSWER_BYTES``, never decompressed), no redirects and no proxy from the
environment. Whatever goes wrong is a ``CredentialUnavailable`` with a fixed reason.

``CallerCredentials`` is a mixin of ``UpstreamServer``: each caller session records the
credential it was opened with (``UpstreamSession.credential``) and is used only while
that is still the caller's credential; a renewed one opens a new session (the old one
closes once its calls are done). A session is per (principal, server), so it never
carries another principal's credential.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable
from typing import Any

import httpx2
from authlib.integrations.httpx_client import AsyncOAuth2Client, OAuthError
from pydantic import SecretStr

from nexus_mcp.calls import SubjectToken, current_subject_token
from nexus_mcp.observability.logs import get_logger
from nexus_mcp.policy.token_exchange import (
    GRANT_TYPE,
    REASON_EXCHANGE_FAILED,
    REASON_EXCHANGE_REFUSED,
    REASON_NO_PRINCIPAL_SECRET,
    REASON_NO_SUBJECT_TOKEN,
    CredentialCache,
    CredentialUnavailable,
    IssuedToken,
    exchange_parameters,
    idp_error_label,
    read_exchange_answer,
)
from nexus_mcp.policy.upstreams import ResolvedSecrets, TokenExchange, UpstreamConfig
from nexus_mcp.principal import Principal
from nexus_mcp.providers.upstream.sessions import (
    GATEWAY_SESSION,
    BoundedTransport,
    SessionKey,
    UpstreamFailure,
    UpstreamSession,
)

log = get_logger(__name__)

MAX_ANSWER_BYTES = 64 * 1024


class TokenExchanger:
    """One identity provider's token endpoint, as this upstream's exchange names it."""

    def __init__(self, config: TokenExchange, client_secret: SecretStr) -> None:
        self.config = config
        self._client_secret = client_secret
        self._verify: ssl.SSLContext | bool = True
        if config.ca_file is not None:
            self._verify = ssl.create_default_context(cafile=str(config.ca_file))

    def _client(self) -> AsyncOAuth2Client:
        config = self.config
        return AsyncOAuth2Client(
            client_id=config.client_id,
            client_secret=self._client_secret.get_secret_value(),
            token_endpoint_auth_method=config.client_auth_method,
            timeout=config.timeout_seconds,
            follow_redirects=False,
            trust_env=False,
            transport=BoundedTransport(
                httpx2.AsyncHTTPTransport(verify=self._verify), MAX_ANSWER_BYTES
            ),
        )

    async def exchange(self, subject: SubjectToken) -> IssuedToken:
        config = self.config
        try:
            async with asyncio.timeout(config.timeout_seconds), self._client() as client:
                answer: Any = await client.fetch_token(
                    config.token_url,
                    grant_type=GRANT_TYPE,
                    **exchange_parameters(config, subject.value),
                )
        except OAuthError as exc:  # the provider said no: its code, from a fixed list
            raise CredentialUnavailable(
                REASON_EXCHANGE_REFUSED, idp_error_label(exc.error)
            ) from None
        except Exception:  # noqa: BLE001 - transport, status, body: never its text
            raise CredentialUnavailable(REASON_EXCHANGE_FAILED) from None
        if not isinstance(answer, dict):
            raise CredentialUnavailable(REASON_EXCHANGE_FAILED)
        return read_exchange_answer(
            answer,
            subject_token=subject.value,
            subject_expires_at=subject.expires_at,
            renew_before_seconds=config.renew_before_seconds,
            now=time.time(),
        )


class CallerCredentials:
    """The credential each caller session of an upstream carries (mixed into
    ``UpstreamServer``; ``setup_credentials`` is called from its constructor)."""

    config: UpstreamConfig
    server_id: str

    def setup_credentials(self, secrets: ResolvedSecrets) -> None:
        creds = self.config.credentials
        self._principal_secrets = dict(secrets.principals)
        self._exchanger: TokenExchanger | None = None
        if creds.type == "token_exchange":
            assert creds.exchange is not None and secrets.client_secret is not None
            self._exchanger = TokenExchanger(creds.exchange, secrets.client_secret)
        self._issued = CredentialCache()
        self._exchanges: dict[SessionKey, asyncio.Future[IssuedToken]] = {}

    async def caller_credential(self, key: SessionKey, principal: Principal) -> SecretStr | None:
        """The bearer token for this caller's session, or None where the upstream takes
        the gateway's own credential. Refusals are ``UpstreamFailure("credential")``."""
        creds = self.config.credentials
        if not creds.per_caller:
            return None
        try:
            if key == GATEWAY_SESSION:  # never: validation refuses ``shared`` with these
                raise CredentialUnavailable(REASON_NO_SUBJECT_TOKEN)
            if creds.type == "per_principal":
                found = self._principal_secrets.get(principal.subject)
                if found is None:
                    raise CredentialUnavailable(REASON_NO_PRINCIPAL_SECRET)
                return found
            return (await self._exchanged(key, current_subject_token())).value
        except CredentialUnavailable as refused:
            log.warning(
                "upstream_credential_unavailable",
                server_id=self.server_id,
                reason=refused.reason,
                idp_error=refused.idp_error,
            )
            facts = {"idp_error": refused.idp_error} if refused.idp_error else {}
            raise UpstreamFailure("credential", refused.reason, **facts) from None

    async def _exchanged(self, key: SessionKey, subject: SubjectToken | None) -> IssuedToken:
        if subject is None:
            raise CredentialUnavailable(REASON_NO_SUBJECT_TOKEN)
        found = self._issued.get(key, time.time())
        if found is not None:
            return found
        # One exchange per caller at a time: callers of the same session key wait for it.
        loop = asyncio.get_running_loop()
        flight = self._exchanges.get(key)
        if flight is not None and flight.get_loop() is loop and not flight.done():
            return await asyncio.shield(flight)
        assert self._exchanger is not None
        flight = loop.create_future()
        self._exchanges[key] = flight
        try:
            issued = await self._exchanger.exchange(subject)
        except Exception as exc:
            flight.set_exception(exc)
            flight.exception()  # retrieved: a flight nobody else awaited logs nothing
            raise
        except BaseException:
            flight.cancel()
            raise
        finally:
            if self._exchanges.get(key) is flight:
                del self._exchanges[key]
        flight.set_result(issued)
        if issued.usable(time.time()):
            self._issued.put(key, issued)
        return issued

    @staticmethod
    def fits(session: UpstreamSession, credential: SecretStr | None) -> bool:
        """A session carries exactly the credential its caller has now."""
        return session.credential == credential

    def retire(self, session: UpstreamSession) -> None:
        """A session whose caller's credential was renewed (the caller has left its
        ``_sessions`` entry already): it closes now, or when its last call in flight
        ends (``release``)."""
        session.retired = True
        self.release(session)

    def release(self, session: UpstreamSession) -> None:
        if session.retired and session.busy == 0 and not session.closed:
            self._spawn(session.close())

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        raise NotImplementedError  # UpstreamServer's


__all__ = ["MAX_ANSWER_BYTES", "CallerCredentials", "TokenExchanger"]
