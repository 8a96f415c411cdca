"""encoder_server.server.intake's choice of model: by name or alias, the default, the first
reranker for a query, and clear errors for an unknown name or the wrong kind."""
from types import SimpleNamespace

import pytest

from encoder_client.protocol import BAD_REQUEST, NOT_FOUND, TOO_LARGE, ProtocolError
from encoder_server.server.intake import EncodeRequest, model_choices, served_model

SERVED = (SimpleNamespace(model_name=("minilm", "text-embedding-ada-002"), name="minilm", kind="embed"),
          SimpleNamespace(model_name=("ce", "reranker"), name="ce", kind="rerank", normalize=False, truncate_at=128,
                          long_texts="truncate"),
          SimpleNamespace(model_name=("e5",), name="e5", kind="embed"))


# an embedding model whose own prompt is far longer than a client's may be
EMBEDDER = SimpleNamespace(name="e5", kind="embed", truncate_at=128, long_texts="truncate", normalize=True,
                           prompts={"query": "q" * 5000}, default_prompt_name=None)


def request(**options):
    return EncodeRequest(b"id", 7, ["a text"], False, False, options=options)


@pytest.mark.parametrize("options, index", [({}, 0), ({"model": "text-embedding-ada-002"}, 0), ({"model": "e5"}, 2),
                                            ({"query": "q"}, 1), ({"query": "q", "model": "reranker"}, 1)])
def test_a_request_goes_to_the_model_it_names_or_the_default(options, index):
    assert served_model(request(**options), SERVED)[0] == index


def test_an_unknown_model_is_not_found_and_the_error_lists_the_served_names():
    with pytest.raises(ProtocolError, match="'nope' is not served here; the models are: minilm, ce, e5") as error:
        served_model(request(model="nope"), SERVED)
    assert error.value.code == NOT_FOUND and error.value.req_id == 7


@pytest.mark.parametrize("options, message", [({"model": "ce"}, "'ce' is a reranker"),
                                              ({"model": "e5", "query": "q"}, "'e5' is an embedder")])
def test_texts_to_a_reranker_or_a_query_to_an_embedder_are_refused(options, message):
    with pytest.raises(ProtocolError, match=message) as error:
        served_model(request(**options), SERVED)
    assert error.value.code == BAD_REQUEST


def test_a_rerank_request_carries_its_query_and_takes_no_prompt():
    assert model_choices(request(query="q", raw_scores=True), SERVED[1]) == {"query": "q", "raw_scores": True,
                                                                            "truncate": True}
    with pytest.raises(ProtocolError, match="takes no prompt"):
        model_choices(request(query="q", prompt="query: "), SERVED[1])


def test_a_query_far_too_long_for_any_pair_is_refused_before_it_is_copied_into_every_job():
    with pytest.raises(ProtocolError, match="the query has 1025 characters.*shorten the query") as error:
        model_choices(request(query="q" * 1025), SERVED[1])
    assert error.value.code == TOO_LARGE
    assert model_choices(request(query="q" * 1024), SERVED[1])["query"] == "q" * 1024


def test_a_prompt_far_too_long_for_any_text_is_refused_before_it_is_copied_onto_every_text():
    with pytest.raises(ProtocolError, match="the prompt has 1025 characters.*128 tokens.*shorten the prompt") as error:
        model_choices(request(prompt="p" * 1025), EMBEDDER)
    assert error.value.code == TOO_LARGE
    assert model_choices(request(prompt="p" * 1024), EMBEDDER)["prompt"] == "p" * 1024
    assert model_choices(request(prompt_name="query"), EMBEDDER)["prompt"] == "q" * 5000  # the model's own: trusted


def test_an_unknown_prompt_name_is_named_in_the_error_but_cut_as_a_model_name_is():
    """The error goes back to the client and into the ventilator's log: a client's 10 MB name must not."""
    with pytest.raises(ProtocolError, match=r"prompt_name 'nope' is not one of the model's prompts \(it has: query\)"):
        model_choices(request(prompt_name="nope"), EMBEDDER)
    with pytest.raises(ProtocolError) as error:
        model_choices(request(prompt_name="x" * 10_000_000), EMBEDDER)
    assert len(str(error.value)) < 300
