"""A cap on HTTP request bodies: a body larger than the server would take is refused with 413 before
it is parsed, and one that declares its size (Content-Length) before it is even read; a body that has
not arrived in full within `timeout` seconds of the request head gets 408 and its connection is closed."""
import asyncio

from starlette.requests import Request

from .errors import GatewayError, render


class BodyLimitMiddleware:
    """ASGI middleware; `limit()` gives the largest body accepted, in bytes, at each request, and
    `timeout` the seconds the whole body may take to arrive (None: no deadline)."""

    def __init__(self, app, limit, timeout=None):
        self.app, self.limit, self.timeout = app, limit, timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        limit = self.limit()
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return await _refuse(scope, receive, send, declared, limit)
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                return await _too_slow(scope, receive, send, self.timeout)
            if message["type"] == "http.disconnect":
                return  # the client left; nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await _refuse(scope, receive, send, size, limit, read_so_far=True)
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)


def _content_length(scope):
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server itself rejects a malformed length
    return None


def _replay(body, receive):
    """A `receive` that hands the app the body already read, then passes on what comes next."""
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _too_slow(scope, receive, send, timeout):
    error = GatewayError(408, f"the request body did not arrive in full within {timeout:g} s "
                              "(--http-body-timeout)", code="request_timeout", headers={"Connection": "close"})
    await render(Request(scope), error)(scope, receive, send)


async def _refuse(scope, receive, send, size, limit, read_so_far=False):
    amount = f"more than {limit >> 20} MB" if read_so_far else f"{size / (1 << 20):.0f} MB"
    error = GatewayError(413, f"the request body is {amount}, above the server's limit of {limit >> 20} MB "
                              "(--max-request-mb); split the input", param="input", code="request_too_large",
                         headers={"Connection": "close"})
    await render(Request(scope), error)(scope, receive, send)
