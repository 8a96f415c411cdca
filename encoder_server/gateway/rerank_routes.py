"""Reranking over HTTP: POST /rerank in text-embeddings-inference's shape, and POST /v1/rerank and
/v2/rerank in Cohere's and Jina's (which LangChain's, LlamaIndex's and the cohere SDK's rerankers
speak). A request that names no model goes to the first reranker the server serves."""
import uuid
from typing import Any, List, Optional, Union

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from encoder_client.rerank import ranked
from encoder_client.validation import check_not_blank, check_unicode

from .errors import GatewayError
from .openai_routes import model_of_kind


class CohereRerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    query: StrictStr
    documents: List[Union[StrictStr, dict]]  # Cohere also takes {"text": ...} objects
    model: Optional[StrictStr] = None
    top_n: Optional[StrictInt] = None
    return_documents: StrictBool = False
    max_chunks_per_doc: Any = None  # Cohere v1's: accepted and ignored, long documents are truncated
    raw_scores: StrictBool = False   # ours, as TEI names it


class TeiRerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    query: StrictStr
    texts: List[StrictStr]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    truncate: StrictBool = True
    model: Optional[StrictStr] = None  # ours: which of the server's rerankers


def rerank_router(link):
    router = APIRouter()

    async def rerank(body, documents, field, top_n=None, truncate=None):
        """(the model's config, (index, score) pairs best first, tokens computed); `field` names the
        documents in errors."""
        model = reranker(link, body.model)
        check_rerank_input(body.query, documents, field, top_n)
        result = await link.encode(documents, query=body.query, model=model["model_name"],
                                   raw_scores=body.raw_scores or None, truncate=truncate)
        return model, ranked(result.embeddings[:, 0], top_n), result.num_tokens

    async def cohere_shape(body: CohereRerankRequest):
        documents = [document_text(item, index) for index, item in enumerate(body.documents)]
        model, results, tokens = await rerank(body, documents, "documents", body.top_n)
        return {"id": str(uuid.uuid4()), "model": model["model_name"],
                "results": [{"index": index, "relevance_score": score,
                             **({"document": {"text": documents[index]}} if body.return_documents else {})}
                            for index, score in results],
                "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
                "usage": {"prompt_tokens": tokens or 0, "total_tokens": tokens or 0}}

    router.add_api_route("/v1/rerank", cohere_shape, methods=["POST"])
    router.add_api_route("/v2/rerank", cohere_shape, methods=["POST"])

    @router.post("/rerank")
    async def tei_shape(body: TeiRerankRequest):
        _, results, _ = await rerank(body, body.texts, "texts", truncate=body.truncate)
        return [{"index": index, "score": score, **({"text": body.texts[index]} if body.return_text else {})}
                for index, score in results]

    return router


def reranker(link, name):
    """The config entry of the reranker named `name` (None: the first reranker served)."""
    return model_of_kind(link, name, "rerank")


def document_text(item, index):
    """A document as a string: itself, or the `text` of a {"text": ...} object."""
    text = item.get("text") if isinstance(item, dict) else item
    if not isinstance(text, str):
        raise GatewayError(400, f"documents[{index}] must be a string or an object with a text string",
                           param="documents")
    return text


def check_rerank_input(query, documents, field, top_n):
    """A 400 naming the problem: no documents, a top_n below 1, or a query or document that is blank
    or not valid unicode."""
    if not documents:
        raise GatewayError(400, f"{field} must not be empty", param=field)
    if top_n is not None and top_n < 1:
        raise GatewayError(400, f"top_n must be a positive integer, got {top_n}", param="top_n")
    for param, where, text in (("query", "query", query),
                               *((field, f"{field}[{i}]", text) for i, text in enumerate(documents))):
        try:
            check_unicode(text, where)
            check_not_blank(text, where)
        except ValueError as error:
            raise GatewayError(400, str(error), param=param) from None
