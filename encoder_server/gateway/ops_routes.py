"""Open routes: /health, /ready, /metrics, the status page and its JSON."""
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from .status_view import status_view


def ops_router(link, metrics):
    router = APIRouter()
    page = resources.files(__package__).joinpath("static/status.html").read_text(encoding="utf-8")

    @router.get("/health")
    async def health():
        return {"alive": True}

    @router.get("/ready")
    async def ready():
        reason, status = link.not_ready(), link.status
        body = {"ready": reason is None, "reason": reason,
                **{field: status[field] if status else None for field in ("workers_alive", "workers_expected",
                                                                          "draining")},
                "models": {name: model["ready"] for name, model in status["models"].items()} if status else None}
        return JSONResponse(body, status_code=200 if reason is None else 503)

    @router.get("/metrics")
    async def prometheus():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @router.get("/status.json")
    async def status_json():
        return JSONResponse(status_view(link), headers={"Cache-Control": "no-store"})

    @router.get("/", response_class=HTMLResponse)
    async def status_page():
        return HTMLResponse(page)

    return router
