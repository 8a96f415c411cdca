"""POST /encode, as bert-as-service's HTTP server: {"id", "texts", "is_tokenized"} -> {"id", "result", "status"},
plus our options (prompt, prompt_name, normalize, truncate, long_texts, dimensions, precision, model), how
many texts were truncated and, with long_texts=chunk, the windows of each text."""
import json
import math

from fastapi import APIRouter, Request

from encoder_client.request import MODEL_OPTIONS, check_model_options
from encoder_client.validation import check_texts

from .array_json import ArrayJSONResponse
from .errors import GatewayError

MAX_ID_DEPTH = 32  # the id is echoed back as sent; deeper than this, it is refused


def bert_router(link):
    router = APIRouter()

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
                                  "truncated": result.truncated, **({"windows": result.windows} if result.windows
                                                                    else {})})

    return router


def _model_options(body):
    """The options of encoder_client.request.MODEL_OPTIONS, as given; a 400 naming one of the wrong type."""
    try:
        return check_model_options({name: body.get(name) for name in MODEL_OPTIONS})
    except (TypeError, ValueError) as error:
        raise GatewayError(400, str(error)) from None


async def _json_object(request):
    try:
        body = json.loads(await request.body(), parse_constant=_refuse_constant, parse_float=_finite_float)
    except ValueError as error:
        raise GatewayError(400, f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise GatewayError(400, "the body is nested too deeply") from None
    if not isinstance(body, dict):
        raise GatewayError(400, 'the body must be a JSON object: {"id": ..., "texts": [...]}')
    if not _nested_at_most(body.get("id"), MAX_ID_DEPTH):
        raise GatewayError(400, f"id is nested more than {MAX_ID_DEPTH} levels deep")
    return body


def _refuse_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:32]} is too large for a number")
    return value


def _nested_at_most(value, depth):
    if isinstance(value, (list, dict)):
        items = value.values() if isinstance(value, dict) else value
        return depth > 0 and all(_nested_at_most(item, depth - 1) for item in items)
    return True
