"""POST /encode, as bert-as-service's HTTP server: {"id", "texts", "is_tokenized"} -> {"id", "result", "status"},
plus our options (prompt, prompt_name, normalize, truncate) and how many texts were truncated."""
from fastapi import APIRouter, Depends, Request

from encoder_client.request import MODEL_OPTIONS, check_model_options
from encoder_client.validation import check_texts

from .array_json import ArrayJSONResponse
from .errors import GatewayError


def bert_router(link, check_key):
    router = APIRouter(dependencies=[Depends(check_key)])

    @router.post("/encode")
    async def encode(request: Request):
        body = await _json_object(request)
        request.state.encode_id = body.get("id")  # echoed in an error body too
        texts, is_tokenized = body.get("texts"), body.get("is_tokenized", False)
        if not isinstance(is_tokenized, bool):
            raise GatewayError(400, "is_tokenized must be true or false")
        try:
            check_texts(texts, is_tokenized)
        except (TypeError, ValueError) as error:
            raise GatewayError(400, str(error)) from None
        result = await link.encode(texts, is_tokenized, **_model_options(body))
        return ArrayJSONResponse({"id": body.get("id"), "result": result.embeddings, "status": 200,
                                  "truncated": result.truncated})

    return router


def _model_options(body):
    """prompt, prompt_name, normalize and truncate, as given; a 400 naming one of the wrong type."""
    try:
        return check_model_options({name: body.get(name) for name in MODEL_OPTIONS})
    except TypeError as error:
        raise GatewayError(400, str(error)) from None


async def _json_object(request):
    try:
        body = await request.json()
    except ValueError:
        raise GatewayError(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise GatewayError(400, 'the body must be a JSON object: {"id": ..., "texts": [...]}')
    return body
