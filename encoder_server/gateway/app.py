"""The FastAPI application: one link to the encoder-server, shared by every route."""
import asyncio
import contextlib
import logging

from fastapi import FastAPI

from encoder_client.version import __version__

from .auth import ApiKeyMiddleware
from .bert_routes import bert_router
from .cohere_routes import cohere_router
from .body_limit import BodyLimitMiddleware
from .errors import install_handlers
from .link import ServerLink
from .metrics import GatewayMetrics, HttpMetricsMiddleware
from .openai_routes import openai_router
from .ops_routes import ops_router
from .rerank_routes import rerank_router
from .sparse_routes import sparse_router

log = logging.getLogger("gateway")


def create_app(client_or_factory, *, api_key=None, body_timeout=None):
    """The gateway app over an AsyncEncoderClient, or a callable that makes one (called once, at
    start-up, inside the event loop). With `api_key`, /v1, /encode and /openapi.json need
    `Authorization: Bearer KEY`; with `body_timeout`, a body that takes longer to arrive gets 408."""
    link = ServerLink(client_or_factory)
    metrics = GatewayMetrics(link)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(link.run())
        task.add_done_callback(_report_crash)
        try:
            yield
        finally:
            link.close()  # first: the task then ends even if the cancellation below is lost
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(title="encoder-server HTTP gateway", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None)  # the docs pages load scripts from a CDN
    app.state.link = link
    app.include_router(openai_router(link))
    app.include_router(bert_router(link))
    app.include_router(rerank_router(link))
    app.include_router(cohere_router(link))
    app.include_router(sparse_router(link))
    app.include_router(ops_router(link, metrics))
    install_handlers(app)
    app.add_middleware(BodyLimitMiddleware, limit=lambda: link.max_request_bytes, timeout=body_timeout)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)  # outside the body limit: before any read
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics)  # the outermost: it counts the 413s too
    return app


def _report_crash(task):
    if not task.cancelled() and task.exception() is not None:
        log.error("the link to the encoder-server failed", exc_info=task.exception())
