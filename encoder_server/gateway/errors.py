"""Gateway errors: one exception type, the client's exceptions mapped onto HTTP status codes, and
the two error bodies (OpenAI's on /v1, bert-as-service's on /encode)."""
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from encoder_client import ConnectionLostError, RequestTooLargeError, ServerBusyError, ServerError
from encoder_client.protocol import BAD_REQUEST, DRAINING, NOT_FOUND, TOO_LARGE

from .array_json import ArrayJSONResponse
from .limits import RETRY_LATER


class GatewayError(Exception):
    """An HTTP error with OpenAI's fields: `kind` is OpenAI's error type, `code` its error code."""

    def __init__(self, status, message, *, param=None, code=None, kind=None, headers=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers


def from_client_error(error):
    """The GatewayError for an exception raised by AsyncEncoderClient."""
    message = str(error)
    if isinstance(error, ServerBusyError):
        return GatewayError(429, message, code="server_busy", kind="rate_limit_error",
                            headers=RETRY_LATER)
    if isinstance(error, RequestTooLargeError):
        return GatewayError(413, message, param="input", code="request_too_large")
    if isinstance(error, (TypeError, ValueError)):
        return GatewayError(400, message, param="input")
    if isinstance(error, TimeoutError):
        return GatewayError(504, message, code="timeout")
    if isinstance(error, PermissionError):  # the server refused the gateway's CURVE key
        return GatewayError(502, message, code="gateway_key_refused")
    if isinstance(error, ConnectionLostError):
        return GatewayError(503, message, code="connection_lost", headers=RETRY_LATER)
    if isinstance(error, ServerError):
        return _from_server_refusal(error)
    raise error


def _from_server_refusal(error):
    """By the refusal's code: the server's wording is for people, not for this mapping."""
    message = str(error)
    if error.code == TOO_LARGE:  # more texts than --max-pending-texts: never admissible
        return GatewayError(413, message, param="input", code="request_too_large")
    if error.code == DRAINING:  # as when the status poll saw the drain first (ServerLink.unavailable)
        return GatewayError(503, message, code="server_unavailable", headers=RETRY_LATER)
    if error.code == BAD_REQUEST:
        return GatewayError(400, message, param="input")
    if error.code == NOT_FOUND:  # a model the server does not serve, as OpenAI answers
        return GatewayError(404, message, param="model", code="model_not_found")
    return GatewayError(500, message)


CLIENT_ERRORS = (ServerError, TimeoutError, ConnectionLostError, PermissionError, TypeError, ValueError)


def openai_body(error):
    return {"error": {"message": error.message, "type": error.kind, "param": error.param, "code": error.code}}


def bert_body(error, request_id=None):
    return {"id": request_id, "status": error.status, "error": error.message}


def render(request, error):
    """The response for `error` in the body shape of the route family that raised it. Its message may
    quote the request (a model's name, an id), lone surrogates included, which ArrayJSONResponse
    escapes where UTF-8 cannot hold them."""
    path = request.url.path
    if path.startswith("/v1"):
        body = openai_body(error)
    elif path.startswith("/encode"):
        body = bert_body(error, getattr(request.state, "encode_id", None))
    else:
        body = {"error": error.message}
    return ArrayJSONResponse(body, status_code=error.status, headers=error.headers)


def validation_error(error):
    """A GatewayError (400) naming the first invalid field of a request FastAPI could not parse."""
    first = error.errors()[0] if error.errors() else {}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    field = ".".join(location) or "body"
    return GatewayError(400, f"invalid request: {field}: {first.get('msg', 'invalid value')}", param=field)


def install_handlers(app):
    @app.exception_handler(GatewayError)
    async def on_gateway_error(request: Request, error: GatewayError):
        return render(request, error)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, error: RequestValidationError):
        return render(request, validation_error(error))

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, error: HTTPException):  # unknown route, wrong method
        return render(request, GatewayError(error.status_code, str(error.detail), headers=error.headers))
