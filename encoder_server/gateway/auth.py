"""Optional API key: `Authorization: Bearer KEY`, the header the OpenAI SDK sends."""
import hmac

from fastapi import Request

from .errors import GatewayError


def bearer_check(api_key):
    """A FastAPI dependency that raises 401 unless the request carries `api_key` (no-op when None)."""
    expected = api_key.encode() if api_key else None

    async def check(request: Request):
        if expected is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise GatewayError(401, "Incorrect or missing API key: send `Authorization: Bearer <key>`",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    return check
