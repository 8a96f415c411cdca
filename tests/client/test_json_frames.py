"""encoder_client.json_frames: orjson where it takes the value, json where it does not, and the
same values either way (a client may run without orjson)."""
import json

import pytest

from encoder_client import json_frames

ORJSON_REFUSES = [b'["\\ud800 lone"]', b'{"x": NaN}', '["utf-16"]'.encode("utf-16")]
VALUES = [["plain", "ünï © 漢字 😀", ""], [["tokenized", "words"], [101, 2023]], ["\ud800 a lone surrogate"],
          {"dtype": "float32", "shape": [2, 384], "tokens": "", "num_tokens": 12}]


@pytest.fixture(params=["orjson", "json alone"])
def frames(request, monkeypatch):
    if request.param == "json alone":
        monkeypatch.setattr(json_frames, "orjson", None)
    elif json_frames.orjson is None:
        pytest.skip("orjson is not installed")
    return json_frames


@pytest.mark.parametrize("value", VALUES)
def test_what_it_writes_reads_back_as_json_reads_it(frames, value):
    written = frames.to_json(value)
    assert frames.from_json(written) == json.loads(written) == value
    assert frames.from_json(memoryview(written)) == value


@pytest.mark.parametrize("data", ORJSON_REFUSES)
def test_what_orjson_refuses_is_read_by_json(frames, data):
    assert repr(frames.from_json(data)) == repr(json.loads(data))


@pytest.mark.parametrize("data", [b"", b"[1,", b'{"a" 1}', b"\xff\xfe\xfa"])
def test_what_neither_reads_raises_jsons_error(frames, data):
    with pytest.raises(ValueError):
        frames.from_json(data)


def test_nesting_deeper_than_json_reads_raises_recursion_error(frames):
    with pytest.raises(RecursionError):
        frames.from_json(b"[" * 100_000 + b"]" * 100_000)
