"""encoder_server.server.windowing.Windowing: long texts cut into windows off the ventilator's loop,
which a socket pair wakes; what waits there is bounded."""
import select
import time
from dataclasses import replace

import pytest

from encoder_client.protocol import TOO_LARGE, ProtocolError
from encoder_server.server import windowing
from encoder_server.server.intake import EncodeRequest
from encoder_server.settings import resolve


@pytest.fixture(scope="module")
def models(tiny_model):
    return resolve(model=str(tiny_model), max_seq_len=16, chunk_overlap=4).all_models


def request(texts, req_id=1):
    return EncodeRequest(b"client", req_id, texts, False, False)


def wait(cutter, expected=1, timeout=10):
    done = []
    while len(done) < expected:
        assert select.select([cutter.fileno()], [], [], timeout)[0], "the windowing thread never woke the loop"
        done += list(cutter.finished())
    return done


def test_a_long_text_comes_back_as_windows_with_its_request(models):
    cutter = windowing.Windowing(models)
    try:
        assert cutter.surely_fit(0, ["a cat"], "") and not cutter.surely_fit(0, ["cat " * 20], "")
        assert cutter.submit(request(["a cat", "cat " * 40]), 0, {"prompt": ""}, "output")
        submitted = time.monotonic()
        [((encode, model, choices, output, arrived), (encoding, counts))] = wait(cutter)
        assert encode.req_id == 1 and model == 0 and output == "output" and arrived <= submitted
        assert counts[0] == 1 and counts[1] > 2 and len(encoding) == sum(counts)
        assert all(len(ids) <= 16 for ids in encoding.ids)
        assert cutter.chars == 0 and len(cutter) == 0
    finally:
        cutter.close()


def test_a_failure_comes_back_as_its_exception(models):
    cutter = windowing.Windowing([replace(models[0], chunk_overlap=14)])
    try:
        cutter.submit(request(["cat " * 40]), 0, {"prompt": ""}, None)
        [(_, error)] = wait(cutter)
        assert isinstance(error, ValueError) and "leaves no room" in str(error)
    finally:
        cutter.close()


def test_what_waits_is_bounded(models, monkeypatch):
    monkeypatch.setattr(windowing, "MAX_WAITING_CHARS", 1000)
    cutter = windowing.Windowing(models)
    try:
        with pytest.raises(ProtocolError, match="1200 characters, above the server's limit of 1000") as refused:
            cutter.submit(request(["cat " * 300]), 0, {"prompt": ""}, None)
        assert refused.value.code == TOO_LARGE
        assert cutter.submit(request(["cat " * 200]), 0, {"prompt": ""}, None)
        assert not cutter.submit(request(["cat " * 200], 2), 0, {"prompt": ""}, None)  # busy until the first is done
        wait(cutter)
        assert cutter.submit(request(["cat " * 200], 3), 0, {"prompt": ""}, None)
        wait(cutter)
    finally:
        cutter.close()


def test_its_tokenizer_leaves_the_gil_to_the_ventilators_loop(models):
    """The Python WordPiece (model/word_pieces.py) holds the GIL for a whole call, which here would
    stall the ventilator's loop; tokenizers releases it while it encodes. A worker's keeps it."""
    from encoder_server.model.tokenizer import Tokenizer
    assert windowing.Windowing(models)._tokenizer(0).python_pieces is False
    assert Tokenizer.for_spec(models[0]).python_pieces is True
