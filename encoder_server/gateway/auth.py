"""Optional API key: `Authorization: Bearer KEY`, the header the OpenAI SDK sends.

It is checked from the headers alone, before the body is read, so a client without the key
cannot make the gateway buffer a large body."""
import hmac

from starlette.requests import Request

from .errors import GatewayError, render

# the embedding and model routes, and the API's schema; /health, /ready, /metrics, / and /status.json stay
# open for probes, scrapers and the status page (its script cannot send the key); /docs and /redoc are off
PROTECTED = ("/v1/", "/v2/", "/encode", "/embed_sparse", "/rerank", "/openapi.json")


class ApiKeyMiddleware:
    """ASGI middleware that answers 401 unless a request to a protected route carries `api_key`."""

    def __init__(self, app, api_key):
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED) and not self.authorized(scope):
            error = GatewayError(401, "Incorrect or missing API key: send `Authorization: Bearer <key>`",
                                 code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return await render(Request(scope), error)(scope, receive, send)
        return await self.app(scope, receive, send)

    def authorized(self, scope):
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, given = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.expected)
