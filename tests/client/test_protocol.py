"""encoder_client.protocol, encoder_client.validation and encoder_server.server.intake."""
import json
import os
import threading

import numpy as np
import pytest

from encoder_client import EncoderClient, RequestTooLargeError, ServerBusyError, ServerError
from encoder_client.errors import reply_error
from encoder_client.keys import as_identity
from encoder_client.protocol import (ProtocolError, Request, decode_reply, decode_request, decode_texts,
                                     encode_data, encode_error, encode_request, encode_result, refusal_topic,
                                     topic)
from encoder_client.request import prepare_encode
from encoder_client.validation import check_texts, looks_tokenized
from encoder_server.security import is_loopback
from encoder_server.server.intake import check_result_size, parse_encode
from encoder_server.settings import Settings


def wire(frames):
    """Frames as a socket would deliver them: plain bytes."""
    return [bytes(frame) for frame in frames]


def request_for(texts, req_id=3, msg_len=None, options=None, identity=b"client-1"):
    payload = json.dumps(texts).encode()
    frames = encode_request(identity, req_id, payload, len(texts) if msg_len is None else msg_len, options)
    return decode_request(wire(frames))


# ----- requests -----

def test_request_round_trip_without_options():
    payload = json.dumps(["a", "b"]).encode()
    frames = encode_request(b"id-1", 17, payload, 2)
    assert len(frames) == 4
    request = decode_request(wire(frames))
    assert request.identity == b"id-1"
    assert request.req_id == 17
    assert request.payload == payload
    assert request.msg_len == 2
    assert request.options == {}
    assert request.command is None
    assert decode_texts(request) == ["a", "b"]


def test_request_round_trip_with_options():
    payload = json.dumps([["a", "b"], ["c"]]).encode()
    frames = encode_request(b"id-2", 5, payload, 2, {"is_tokenized": True, "show_tokens": False})
    assert len(frames) == 5
    request = decode_request(wire(frames))
    assert request.options["is_tokenized"] is True
    assert request.options["show_tokens"] is False
    assert request.options["v"] == 2
    assert decode_texts(request) == [["a", "b"], ["c"]]


def test_command_request():
    request = decode_request(wire(encode_request(b"id", 1, b"SHOW_CONFIG")))
    assert request.command == b"SHOW_CONFIG"
    assert decode_request(wire(encode_request(b"id", 1, b"SHOW_SOMETHING"))).command is None


@pytest.mark.parametrize("count", [1, 2, 3, 6])
def test_wrong_frame_count(count):
    frames = [b"ident", b"[]", b"1", b"0", b"{}", b"extra"][:count]
    with pytest.raises(ProtocolError) as info:
        decode_request(frames)
    assert info.value.identity == b"ident"


def test_no_frames():
    with pytest.raises(ProtocolError) as info:
        decode_request([])
    assert info.value.identity is None


@pytest.mark.parametrize("req_id", [b"abc", b"", b"1.5", b"\xff"])
def test_non_numeric_req_id(req_id):
    with pytest.raises(ProtocolError) as info:
        decode_request([b"ident", b"[]", req_id, b"0"])
    assert info.value.identity == b"ident"
    assert "req_id" in str(info.value)


@pytest.mark.parametrize("msg_len", [b"x", b"", b"2e3"])
def test_non_numeric_msg_len(msg_len):
    with pytest.raises(ProtocolError) as info:
        decode_request([b"ident", b"[]", b"12", msg_len])
    assert info.value.identity == b"ident"
    assert info.value.req_id == 12
    assert "msg_len" in str(info.value)


@pytest.mark.parametrize("options", [b"{not json", b"[1, 2]", b"\"text\"", b"\xff\xfe\x00", b"null"])
def test_bad_options(options):
    with pytest.raises(ProtocolError) as info:
        decode_request([b"ident", b"[]", b"8", b"0", options])
    assert info.value.identity == b"ident"
    assert info.value.req_id == 8


def test_oversized_identity():
    with pytest.raises(ProtocolError) as info:
        decode_request([b"x" * 257, b"[]", b"1", b"0"])
    assert info.value.identity is None
    # the limit itself is fine
    assert decode_request([b"x" * 256, b"[]", b"1", b"0"]).identity == b"x" * 256


@pytest.mark.parametrize("identity", [b"a\0", b"\0", b"a\0b"])
def test_an_identity_with_a_nul_byte_is_refused(identity):
    """NUL ends every topic: an identity holding one would have a topic that another identity's
    subscription could match."""
    with pytest.raises(ProtocolError, match="NUL") as info:
        decode_request([identity, b"[]", b"1", b"0"])
    assert info.value.identity is None
    with pytest.raises(ValueError, match="NUL"):
        as_identity(identity)


def test_topics_of_two_identities_are_never_prefixes_of_each_other():
    identities = [b"", b"a", b"ab", b"a b", "é".encode(), b"x" * 256]
    for one in identities:
        for other in identities:
            assert topic(other).startswith(topic(one)) == (one == other)
    assert refusal_topic(b"a").startswith(topic(b"a")) and not topic(b"ab").startswith(refusal_topic(b"a"))


def test_client_identity_is_checked_before_anything_is_sent():
    with pytest.raises(ValueError, match="at most 256 bytes"):
        EncoderClient(identity="x" * 257, port=1, port_out=2)
    assert as_identity("team") == b"team" and len(as_identity(None)) == 36


@pytest.mark.parametrize("payload", [b"[\"unterminated", b"\x80\x81\xfe\xff", b"", b"not json"])
def test_decode_texts_rejects_junk(payload):
    request = decode_request([b"ident", payload, b"4", b"1"])
    with pytest.raises(ProtocolError) as info:
        decode_texts(request)
    assert info.value.identity == b"ident"
    assert info.value.req_id == 4


def test_protocol_error_is_value_error():
    assert issubclass(ProtocolError, ValueError)


# ----- replies -----

@pytest.mark.parametrize("shape", [(3, 4), (2, 5, 4), (1, 1)])
def test_result_round_trip(shape):
    array = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    reply = decode_reply(wire(encode_result(b"id", 9, array)))
    assert reply.req_id == 9
    assert reply.array.dtype == np.float32
    assert reply.array.shape == shape
    np.testing.assert_array_equal(reply.array, array)
    assert reply.tokens is None
    assert reply.error is None and reply.data is None


def test_result_round_trip_non_contiguous_array():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    array = base.T                            # Fortran-ordered view
    reply = decode_reply(wire(encode_result(b"id", 1, array)))
    assert reply.array.shape == (4, 3)
    np.testing.assert_array_equal(reply.array, array)


def test_result_round_trip_with_tokens():
    array = np.ones((2, 3), dtype=np.float32)
    tokens = [["[CLS]", "hello", "[SEP]"], ["[CLS]", "hi", "there", "[SEP]"]]
    frames = encode_result(b"id", 2, array, tokens)
    assert frames[0] == b"id\0"  # the identity's topic
    reply = decode_reply(wire(frames))
    assert reply.tokens == tokens
    np.testing.assert_array_equal(reply.array, array)


def test_error_round_trip():
    frames = encode_error(b"id", 11, "bad request: no")
    assert len(frames) == 4 and frames[0] == b"id\0"
    reply = decode_reply(wire(frames))
    assert reply.req_id == 11
    assert reply.error == "bad request: no"
    assert reply.array is None and reply.data is None


def test_data_round_trip():
    data = {"ready": True, "queue_depth": {"priority": 0}, "n": 3}
    frames = encode_data(b"id", 12, data)
    assert len(frames) == 3
    reply = decode_reply(wire(frames))
    assert reply.req_id == 12
    assert reply.data == data
    assert reply.array is None and reply.error is None


@pytest.mark.parametrize("frame", [b"-1", b"18446744073709551616", b"1" * 5000])
def test_req_id_outside_64_bits_is_refused(frame):
    with pytest.raises(ProtocolError, match="req_id frame is not an integer from 0 to 2\\*\\*64-1"):
        decode_request([b"id", b'["a"]', frame, b"1"])


@pytest.mark.parametrize("frames, message", [
    ([b"id", b"[" * 100000 + b"]" * 100000, b"1", b"1"], "payload is nested too deeply"),
    ([b"id", b'["a"]', b"1", b"1", b'{"a":' * 50000 + b"1" + b"}" * 50000], "options frame is not a JSON object"),
])
def test_deep_nesting_is_a_protocol_error(frames, message):
    """Each of these once raised RecursionError in the ventilator's loop and stopped the server."""
    with pytest.raises(ProtocolError, match=message):
        parse_encode(decode_request(frames), show_tokens_allowed=False)


@pytest.mark.parametrize("name", ["is_tokenized", "show_tokens"])
def test_flags_must_be_booleans(name):
    with pytest.raises(ProtocolError, match=f"{name} must be true or false, got str"):
        parse_encode(request_for(["a"], options={name: "yes"}), show_tokens_allowed=True)


def test_client_request_ids_are_random_64_bit_numbers():
    from encoder_client.request import new_req_id
    ids = {new_req_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(0 <= i < 2 ** 64 for i in ids) and max(ids) > 2 ** 60


def test_request_ids_stay_unique_across_threads():
    from encoder_client.request import REQ_IDS_PER_DRAW, new_req_id
    drawn = [[] for _ in range(8)]
    threads = [threading.Thread(target=lambda ids=ids: ids.extend(new_req_id() for _ in range(3 * REQ_IDS_PER_DRAW)))
               for ids in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    every = [req_id for ids in drawn for req_id in ids]
    assert len(every) == 8 * 3 * REQ_IDS_PER_DRAW and len(set(every)) == len(every)


def test_a_forked_child_draws_request_ids_of_its_own():
    """The ids a parent drew ahead are not the child's: a child would otherwise send the very
    numbers its parent is about to use."""
    from encoder_client.request import new_req_id
    new_req_id()  # the parent holds ids drawn ahead
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(writing, b"%d" % new_req_id())
        os._exit(0)
    os.close(writing)
    child = int(os.read(reading, 64))
    os.waitpid(pid, 0)
    os.close(reading)
    assert child not in {new_req_id() for _ in range(1000)}


def test_negative_req_id_round_trip():
    reply = decode_reply(wire(encode_error(b"id", -1, "x")))
    assert reply.req_id == -1


# ----- check_texts -----

@pytest.mark.parametrize("texts", ["a string", ("a", "b"), None, {"a": 1}, 5])
def test_check_texts_non_list(texts):
    with pytest.raises(TypeError):
        check_texts(texts)


@pytest.mark.parametrize("texts, index", [(["a", "b", 3], 2), ([None], 0), (["a", b"bytes"], 1),
                                          (["a", ["b"]], 1)])
def test_check_texts_non_str_item(texts, index):
    with pytest.raises(TypeError, match=rf"texts\[{index}\]"):
        check_texts(texts)


def test_check_texts_empty_list():
    with pytest.raises(ValueError):
        check_texts([])
    with pytest.raises(ValueError):
        check_texts([], is_tokenized=True)


@pytest.mark.parametrize("texts, index", [(["a", "b", ""], 2), (["   "], 0), (["a", "\t\n "], 1), (["\x00"], 0),
                                          (["ok", "\u200b\u200c\u200d\ufeff"], 1), (["\x00 \u2028\x7f\u00ad"], 0),
                                          (["\U000e0020\U000e007f"], 0)])
def test_check_texts_empty_or_whitespace(texts, index):
    """Control and zero-width characters alone are refused like an empty text: tokenizers drop them."""
    with pytest.raises(ValueError, match=rf"texts\[{index}\] is empty or whitespace-only"):
        check_texts(texts)
    with pytest.raises(ValueError, match=rf"texts\[{index}\]\[1\] is empty or whitespace-only"):
        check_texts([["word"]] * index + [["word", texts[index]]], is_tokenized=True)


@pytest.mark.parametrize("text", ["a\u200b", "\u200bz", "\x00 \u00e9", "\ue000", "\t\n\u3000\u4e00", "\u200d\U0001f600"])
def test_check_texts_takes_any_visible_character(text):
    check_texts([text])


@pytest.mark.parametrize("texts, is_tokenized, where", [
    (["\ud800"], False, r"texts\[0\] holds a lone surrogate \(U\+D800\) at character 0"),
    (["fine", "ok \udfff tail"], False, r"texts\[1\] holds a lone surrogate \(U\+DFFF\) at character 3"),
    ([["a"], ["b", "x\udbff"]], True, r"texts\[1\]\[1\] holds a lone surrogate"),
])
def test_check_texts_refuses_lone_surrogates(texts, is_tokenized, where):
    """Valid JSON ("\\ud800") but no Unicode character: no tokenizer takes it, and it once
    crashed every worker that received it."""
    with pytest.raises(ValueError, match=where):
        check_texts(texts, is_tokenized)
    with pytest.raises(ProtocolError, match=where):
        parse_encode(request_for(texts), show_tokens_allowed=False)


def test_a_prompt_with_a_lone_surrogate_is_refused():
    with pytest.raises(ValueError, match="prompt holds a lone surrogate"):
        prepare_encode(["a"], prompt="query: \ud83d")
    with pytest.raises(ProtocolError, match="prompt holds a lone surrogate"):
        parse_encode(request_for(["a"], options={"prompt": "\ud83d"}), show_tokens_allowed=False)


def test_check_texts_accepts_good_input():
    check_texts(["hello", " padded ", "ünïcödé", "emoji \U0001F600 (a surrogate pair in JSON)"])
    check_texts([["hello", "world"], ["x"]], is_tokenized=True)


@pytest.mark.parametrize("texts, error, where", [
    (["a b"], TypeError, r"texts\[0\]"),
    ([["a"], "b"], TypeError, r"texts\[1\]"),
    ([["a"], []], ValueError, r"texts\[1\]"),
    ([["a", 1]], TypeError, r"texts\[0\]\[1\]"),
    ([["a"], ["b", " "]], ValueError, r"texts\[1\]\[1\]"),
    ([["a"], ["b", ""]], ValueError, r"texts\[1\]\[1\]"),
])
def test_check_texts_tokenized(texts, error, where):
    with pytest.raises(error, match=where):
        check_texts(texts, is_tokenized=True)


def test_looks_tokenized():
    assert looks_tokenized([["a"], ["b", "c"]])
    assert not looks_tokenized([["a"], "b"])
    assert not looks_tokenized(["a"])
    assert not looks_tokenized([])
    assert not looks_tokenized("abc")


# ----- parse_encode -----

def test_parse_encode_plain():
    parsed = parse_encode(request_for(["a", "b", "c"], req_id=6), show_tokens_allowed=False)
    assert parsed.identity == b"client-1" and parsed.req_id == 6
    assert parsed.texts == ["a", "b", "c"]
    assert parsed.is_tokenized is False
    assert parsed.with_tokens is False


@pytest.mark.parametrize("msg_len", [0, 2, 4])
def test_parse_encode_msg_len_mismatch(msg_len):
    with pytest.raises(ProtocolError) as info:
        parse_encode(request_for(["a", "b", "c"], msg_len=msg_len, req_id=77), False)
    assert info.value.identity == b"client-1"
    assert info.value.req_id == 77


def test_parse_encode_show_tokens_not_allowed():
    with pytest.raises(ProtocolError) as info:
        parse_encode(request_for(["a"], options={"show_tokens": True}), show_tokens_allowed=False)
    assert info.value.identity == b"client-1"


def test_parse_encode_show_tokens():
    assert parse_encode(request_for(["a"], options={"show_tokens": True}), True).with_tokens is True
    assert parse_encode(request_for(["a"], options={"show_tokens": False}), True).with_tokens is False
    assert parse_encode(request_for(["a"], options={"show_tokens": False}), False).with_tokens is False
    # bert-as-service's client sends no options: tokens whenever the server allows them
    assert parse_encode(request_for(["a"]), True).with_tokens is True


def test_parse_encode_infers_tokenized_without_options():
    parsed = parse_encode(request_for([["hello", "world"], ["x"]]), False)
    assert parsed.is_tokenized is True
    assert parsed.texts == [["hello", "world"], ["x"]]


def test_parse_encode_explicit_tokenized_option():
    parsed = parse_encode(request_for([["a"]], options={"is_tokenized": True}), False)
    assert parsed.is_tokenized is True
    with pytest.raises(ProtocolError):
        parse_encode(request_for(["a"], options={"is_tokenized": True}), False)
    with pytest.raises(ProtocolError):
        parse_encode(request_for([["a"]], options={"is_tokenized": False}), False)


@pytest.mark.parametrize("texts, where", [(["a", ""], "texts[1]"), (["a", 5, "b"], "texts[1]"),
                                          ([], "empty"), ([["a"], ["b", ""]], "texts[1][1]")])
def test_parse_encode_invalid_texts(texts, where):
    with pytest.raises(ProtocolError) as info:
        parse_encode(request_for(texts, req_id=31), False)
    assert where in str(info.value)
    assert info.value.identity == b"client-1" and info.value.req_id == 31


@pytest.mark.parametrize("payload", [b"{\"a\": 1}", b"\"just a string\"", b"42", b"null"])
def test_parse_encode_non_list_payload(payload):
    request = Request(b"id", 2, payload, 1)
    with pytest.raises(ProtocolError) as info:
        parse_encode(request, False)
    assert info.value.identity == b"id"


def test_parse_encode_invalid_json():
    with pytest.raises(ProtocolError):
        parse_encode(Request(b"id", 2, b"\xff\x00junk", 1), False)


# ----- is_loopback -----

@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1", True),
    ("127.5.6.7", True),
    ("::1", True),
    ("::ffff:127.0.0.1", True),
    ("10.0.0.1", False),
    ("192.168.1.20", False),
    ("::ffff:10.0.0.1", False),
    ("2001:db8::1", False),
    (None, False),
    ("", False),
    ("localhost", False),
    ("not an address", False),
    ("127.0.0.1:5555", False),
])
def test_is_loopback(address, expected):
    assert is_loopback(address) is expected


def test_busy_error_carries_its_code_and_plain_errors_none():
    busy = decode_reply(wire(encode_error(b"c", 4, "server busy", code="busy")))
    plain = decode_reply(wire(encode_error(b"c", 5, "bad request")))
    assert (busy.error, busy.code) == ("server busy", "busy")
    assert (plain.error, plain.code) == ("bad request", None)


@pytest.mark.parametrize("code, kind", [("busy", ServerBusyError), ("too_large", ServerError),
                                        ("draining", ServerError), (None, ServerError)])
def test_error_replies_become_exceptions_that_keep_their_code(code, kind):
    error = reply_error(decode_reply(wire(encode_error(b"c", 6, "no", code=code))))
    assert type(error) is kind and error.code == code and error.req_id == 6 and str(error) == "no"


def test_parse_errors_say_bad_request_and_too_many_texts_say_too_large():
    with pytest.raises(ProtocolError) as bad:
        parse_encode(request_for(["ok", ""]), show_tokens_allowed=False)
    assert bad.value.code == "bad_request"
    with pytest.raises(ProtocolError) as large:
        parse_encode(request_for(["a", "b", "c"]), show_tokens_allowed=False, max_texts=2)
    assert large.value.code == "too_large"


@pytest.mark.parametrize("strategy, texts, refused", [("mean", 300_000, False), ("mean", 400_000, True),
                                                     ("none", 1_000, False), ("none", 2_000, True)])
def test_a_result_above_max_result_mb_is_refused_at_admission(strategy, texts, refused):
    """384 floats per row: a mean-pooled row is 1.5 KB, a token-level text up to 256 rows (384 KB)."""
    settings = Settings(pooling_strategy=strategy, pooling_layer=(-1,), hidden_size=384, truncate_at=256,
                        max_result_mb=512)
    request = parse_encode(request_for(["a"] * texts), show_tokens_allowed=False)
    if not refused:
        check_result_size(request, settings)
        return
    with pytest.raises(ProtocolError, match=rf"the result of {texts} .*above the server's limit of 512 MB") as error:
        check_result_size(request, settings)
    assert error.value.code == "too_large"


def test_a_request_above_the_size_limit_is_refused_before_sending():
    with pytest.raises(RequestTooLargeError, match="above the server's limit of 1 MB"):
        prepare_encode(["x" * (1 << 20)], max_request_bytes=1 << 20)
    assert issubclass(RequestTooLargeError, ValueError)  # callers catching ValueError still do


def test_parse_encode_reads_the_timeout_and_limits_the_size():
    parsed = parse_encode(request_for(["a"], options={"timeout_ms": 1500}), show_tokens_allowed=False)
    assert parsed.timeout_s == 1.5
    for bad in (0, -3, "soon", True, [1], float("inf"), float("nan"), 10 ** 400, 1e300):
        with pytest.raises(ProtocolError, match="timeout_ms must be a number of milliseconds above 0"):
            parse_encode(request_for(["a"], options={"timeout_ms": bad}), show_tokens_allowed=False)
    with pytest.raises(ProtocolError, match="3 texts in one request is above the server's limit of 2"):
        parse_encode(request_for(["a", "b", "c"]), show_tokens_allowed=False, max_texts=2)


def test_a_large_result_is_streamed_in_chunks_that_a_reader_puts_back_together():
    from encoder_client.protocol import CHUNK_BYTES, ReplyReader, result_messages
    rng = np.random.default_rng(0)
    big = rng.standard_normal((300, 64, 8)).astype(np.float32)  # 600 KB: 5 chunks of 128 KB
    tokens = [["[CLS]", "a", "[SEP]"]] * 300
    chunk = 128 << 10
    messages = list(result_messages(b"c", 7, big, tokens, num_tokens=900, truncated=2, streamed=True,
                                    chunk_bytes=chunk))
    assert len(messages) == 5 and all(len(m[2]) <= chunk for m in messages)
    assert len(list(result_messages(b"c", 7, big, streamed=True))) == 1  # within CHUNK_BYTES: one message
    batch = np.zeros((256, 1024), np.float32)  # a batch of 256 rows of the widest common models: one message
    assert batch.nbytes <= CHUNK_BYTES and len(list(result_messages(b"c", 7, batch, streamed=True))) == 1
    assert all(json.loads(m[1])["tokens"] == "" for m in messages[1:])  # the tokens travel once
    small = rng.standard_normal((4, 8)).astype(np.float32)
    assert len(list(result_messages(b"c", 8, small, streamed=True))) == 1
    assert len(list(result_messages(b"c", 9, big, streamed=False))) == 1  # protocol 1 clients: bert-serving-client
    reader = ReplyReader()
    other = list(result_messages(b"c", 10, big[::-1].copy(), streamed=True, chunk_bytes=chunk))
    order = [messages[3], other[0], messages[0], messages[4], messages[1], other[1], messages[1], messages[2]]
    replies = [reader.read(wire(frames)) for frames in order]
    assert replies[:-1] == [None] * 7
    done = replies[-1]
    assert (done.req_id, done.num_tokens, done.truncated, done.tokens) == (7, 900, 2, tokens)
    np.testing.assert_array_equal(done.array, big)
    assert reader.read(wire(next(result_messages(b"c", 8, small, streamed=True)))).array.shape == (4, 8)


def test_a_reader_forgets_results_whose_chunks_stopped_coming():
    from encoder_client.protocol import ReplyReader, result_messages
    reader = ReplyReader(max_partial=2)
    big = np.ones((300, 1024), dtype=np.float32)
    for req_id in range(3):
        assert reader.read(wire(next(result_messages(b"c", req_id, big, streamed=True)))) is None
    assert sorted(reader._partial) == [1, 2]


def test_payloads_of_millions_of_lists_are_refused_before_parsing_and_brackets_in_texts_pass():
    texts = ["code: a[i] = {k: v[0]} \\\" \\\\[" * 20] * 50  # 4,000 brackets, inside strings
    assert len(parse_encode(request_for(texts), show_tokens_allowed=False, max_texts=100).texts) == 50
    words = [["x", "[", "]"]] * 50
    assert parse_encode(request_for(words), show_tokens_allowed=False, max_texts=100).is_tokenized
    for payload, words in [(b"[" + b"[]," * 500 + b"[]]", "502 JSON lists or objects; a request has at most 101"),
                           (b"[" + b'"a",' * 1_000_001 + b"[]" * 200 + b'"a"]', "too many to check before parsing")]:
        with pytest.raises(ProtocolError, match=words) as error:
            parse_encode(Request(b"c", 1, payload, 1), show_tokens_allowed=False, max_texts=100)
        assert error.value.code == "too_large"
