"""The whole service on loopback: real server processes, real sockets, the tiny random BERT."""
import threading
import time

import numpy as np
import pytest

from conftest import random_texts, reference_embeddings, running_server, settled_status, wait_for
from encoder_client import ConcurrentEncoderClient, EncoderClient, ServerError

pytestmark = pytest.mark.timeout(300)


def test_encode_matches_in_process_reference(tiny_server, tiny_model):
    texts = random_texts(40, seed=1) + ["a", "the red cat"]
    with tiny_server.client() as client:
        result = client.encode(texts)
    assert result.dtype == np.float32 and result.shape == (len(texts), 32)
    np.testing.assert_allclose(result, reference_embeddings(tiny_model, texts), atol=1e-5)


def test_large_request_is_split_and_reassembled_in_order(tiny_server, tiny_model):
    texts = random_texts(300, seed=2)  # 10 jobs of 32 texts, over two workers
    with tiny_server.client() as client:
        result = client.encode(texts)
    np.testing.assert_allclose(result, reference_embeddings(tiny_model, texts), atol=1e-5)


def test_long_text_is_truncated_not_rejected(tiny_server, tiny_model):
    texts = ["the cat " * 500, "dog"]
    with tiny_server.client() as client:
        result = client.encode(texts)
    np.testing.assert_allclose(result, reference_embeddings(tiny_model, texts, max_length=64), atol=1e-5)


def test_concurrent_clients_each_get_their_own_rows(tiny_server, tiny_model):
    corpora = [random_texts(n, seed=10 + n) for n in (1, 3, 7, 50, 90, 5)]
    results = encode_concurrently(tiny_server, corpora)
    for index, texts in enumerate(corpora):
        np.testing.assert_allclose(results[index], reference_embeddings(tiny_model, texts), atol=1e-5)


def encode_concurrently(server, corpora, rounds=1):
    """One client thread per corpus, each encoding it `rounds` times; the last results, by index."""
    results, errors = {}, []

    def run(index, texts):
        try:
            with server.client() as client:
                for _ in range(rounds):
                    results[index] = client.encode(texts)
        except Exception as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=run, args=item) for item in enumerate(corpora)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    return results


def test_concurrent_encoder_client_is_thread_safe(tiny_server):
    texts = random_texts(24, seed=3)
    with tiny_server.client() as client:
        expected = client.encode(texts)
    with ConcurrentEncoderClient(max_concurrency=3, port=tiny_server.port, port_out=tiny_server.port_out,
                                 timeout=60) as pool:
        outputs = [None] * 12
        threads = [threading.Thread(target=lambda i=i: outputs.__setitem__(i, pool.encode(texts[i:i + 12])))
                   for i in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert pool.server_status["ready"]
    for i, output in enumerate(outputs):
        np.testing.assert_allclose(output, expected[i:i + 12], atol=1e-6)


def test_non_blocking_encode_and_fetch_all(tiny_server):
    batches = [random_texts(n, seed=n) for n in (5, 1, 40, 2)]
    with tiny_server.client() as client:
        expected = [client.encode(batch) for batch in batches]
        for batch in batches:
            assert client.encode(batch, blocking=False) is None
        fetched = client.fetch_all(sort=True)
        for batch in batches:
            client.encode(batch, blocking=False)
        concatenated = client.fetch_all(concat=True)
    for got, want in zip(fetched, expected):
        np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(concatenated, np.concatenate(expected), atol=1e-6)


def test_encode_async_yields_one_result_per_batch_in_order(tiny_server):
    batches = [random_texts(1 + i % 7, seed=100 + i) for i in range(30)]
    with tiny_server.client() as client:
        expected = [client.encode(batch) for batch in batches]
        results = list(client.encode_async(iter(batches), max_in_flight=4))
        limited = list(client.encode_async(iter(batches), max_num_batch=5))
    assert len(results) == len(batches) and len(limited) == 5
    for got, want in zip(results, expected):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_listener_sharing_an_identity_receives_every_result(tiny_server):
    texts = random_texts(6, seed=4)
    with tiny_server.client(identity="team", timeout=30) as listener, \
            tiny_server.client(identity="team") as sender:
        stream = listener.listen()
        result = sender.encode(texts)
        req_id, received = next(stream)
    np.testing.assert_array_equal(received, result)


def test_groups_a_and_ab_are_served_at_once_and_each_sees_only_its_own(tiny_server):
    """Each reply goes out under its identity's whole topic: "a" never sees "ab"'s results, and
    (unlike the prefix rule before it) "ab" may subscribe while "a" listens."""
    with tiny_server.client(identity="a", timeout=10) as a_sender, \
            tiny_server.client(identity="ab", timeout=10) as ab_sender, \
            tiny_server.client(identity="a", timeout=2) as a_listener, \
            tiny_server.client(identity="ab", timeout=2) as ab_listener:
        a_stream, ab_stream = a_listener.listen(), ab_listener.listen()
        a_result, ab_result = a_sender.encode(["the cat"]), ab_sender.encode(["the dog", "a red bird"])
        np.testing.assert_array_equal(next(a_stream)[1], a_result)
        np.testing.assert_array_equal(next(ab_stream)[1], ab_result)
        for stream in (a_stream, ab_stream):
            with pytest.raises(TimeoutError):
                next(stream)  # nothing else came: not the other group's result


def test_small_request_overtakes_a_large_one(tiny_server):
    big = random_texts(20000, seed=5, min_words=20, max_words=40)
    with tiny_server.client() as big_client, tiny_server.client() as small_client:
        big_client.encode(big, blocking=False)
        wait_for(lambda: small_client.server_status["queue_depth"]["bulk"] > 0)
        small_client.encode(["the cat"])
        # the big request's jobs were still queued when the small reply came back
        assert small_client.server_status["queue_depth"]["bulk"] > 0
        assert big_client.fetch_all()[0].shape == (len(big), 32)


def test_tokenized_input_and_tokens_back(tiny_server, tiny_model):
    words = [["the", "red", "cat"], ["dog"]]
    with tiny_server.client() as client:
        vectors, tokens = client.encode(words, is_tokenized=True, show_tokens=True)
    assert tokens == [["[CLS]", "the", "red", "cat", "[SEP]"], ["[CLS]", "dog", "[SEP]"]]
    np.testing.assert_allclose(vectors, reference_embeddings(tiny_model, words, is_tokenized=True), atol=1e-5)


def test_server_config_and_status(tiny_server):
    with tiny_server.client() as client:
        config, status = client.server_config, client.server_status
    assert config["pooling_strategy"] == "mean" and config["pooling_layer"] == [-2]
    assert config["max_seq_len"] == 64 and config["num_worker"] == 2 and config["tokenizer_threads"] == 3
    assert "/" not in str(config["model"]) and "ipc" not in str(config)
    assert status["ready"] and status["workers_alive"] == 2
    assert set(status["queue_depth"]) >= {"priority", "bulk"}


@pytest.mark.parametrize("texts, error, fragment", [
    ("not a list", TypeError, "must be a list"),
    ([], ValueError, "empty list"),
    (["ok", ""], ValueError, "texts[1]"),
    (["ok", "fine", "   "], ValueError, "texts[2]"),
    (["ok", 3], TypeError, "texts[1]"),
])
def test_client_rejects_bad_input_naming_the_index(tiny_server, texts, error, fragment):
    with tiny_server.client() as client:
        with pytest.raises(error) as raised:
            client.encode(texts)
        assert fragment in str(raised.value)
        assert client.encode(["still works"]).shape == (1, 32)


def test_client_times_out_when_no_server_listens():
    from conftest import free_port
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no answer"):
        EncoderClient("127.0.0.1", free_port(), free_port(), timeout=1)
    assert time.monotonic() - started < 5


def test_waiting_forever_still_bounds_the_connect():
    from conftest import free_port
    import encoder_client.client as client_module
    started = time.monotonic()
    original = client_module.CONNECT_TIMEOUT
    client_module.CONNECT_TIMEOUT = 1.5
    try:
        with pytest.raises(TimeoutError):
            EncoderClient("127.0.0.1", free_port(), free_port(), timeout=None)
    finally:
        client_module.CONNECT_TIMEOUT = original
    assert time.monotonic() - started < 6


def test_late_reply_after_timeout_is_discarded(tiny_server):
    texts = random_texts(20000, seed=6, min_words=20, max_words=40)
    with tiny_server.client(timeout=0.2) as client:
        with pytest.raises(TimeoutError):
            client.encode(texts)
        client.timeout = 120
        # status replies travel behind the late result, which the client must skip
        wait_for(lambda: client.server_status["in_flight_requests"] == 0)
        small = client.encode(["the sun"])
        assert small.shape == (1, 32)
        assert not client._pending and not client._arrived


def test_show_tokens_error_reply_is_a_server_error(tmp_path, tiny_model):
    from conftest import running_server
    with running_server(tiny_model, "--pooling-strategy", "none", "--pooling-layer", "-1", "-2",
                        "--max-seq-len", "16", "--mask-cls-sep", tmp_path=tmp_path) as server:
        with server.client() as client:
            with pytest.raises(ServerError, match="show_tokens is disabled"):
                client.encode(["the cat"], show_tokens=True)
            tokens = client.encode(["the red cat", "dog", "the " * 40])
    assert tokens.shape == (3, 16, 64)
    # [CLS], [SEP] and padding are zero; real tokens are not
    assert np.all(tokens[0, 0] == 0) and np.all(tokens[0, 4:] == 0) and np.all(tokens[0, 1:4] != 0)
    assert np.all(tokens[1, 2:] == 0) and np.all(tokens[2, 15] == 0) and np.all(tokens[2, 1:15] != 0)


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_passes_shared_across_clients_return_every_row_to_its_request(tmp_path, tiny_model, backend):
    """One worker, a batch wait and small jobs: passes mix rows of many clients' requests."""
    corpora = [random_texts(n, seed=100 + i) for i, n in enumerate((1, 2, 3, 4, 9, 17, 30, 1, 2, 40, 3, 1))]
    with running_server(tiny_model, "--backend", backend, "--num-worker", "1", "--batch-wait-ms", "20",
                        "--priority-batch-size", "4", "--max-batch-size", "8", "--max-batch-tokens", "400",
                        tmp_path=tmp_path) as server:
        results = encode_concurrently(server, corpora, rounds=3)
    for index, texts in enumerate(corpora):
        np.testing.assert_allclose(results[index], reference_embeddings(tiny_model, texts), atol=2e-5)


def test_show_progress_pipelines_sub_requests_under_a_bar(tiny_server, tiny_model, capsys):
    texts = random_texts(2500, seed=21)  # three sub-requests of at most 1024 texts
    with tiny_server.client() as client:
        plain = client.encode(texts)
        served_before = settled_status(client)["requests"]["served"]
        with_bar = client.encode(texts, show_progress=True)
        served_after = settled_status(client)["requests"]["served"]
    np.testing.assert_allclose(with_bar, plain, atol=1e-5)  # rows may share passes differently
    assert served_after - served_before == 3
    assert "2500/2500" in capsys.readouterr().err


def test_status_metrics_move_with_traffic(tiny_server):
    with tiny_server.client() as client:
        before = client.server_status["metrics"]
        client.encode(random_texts(200, seed=22))
        time.sleep(1.5)  # workers report with their next heartbeat
        after = client.server_status["metrics"]
    for name in ("queue_seconds", "inference_seconds", "request_seconds", "batch_rows"):
        assert after["histograms"][name]["count"] > before["histograms"][name]["count"], name
    assert after["tokens"]["real"] - before["tokens"]["real"] >= 200 * 3
    assert 0 < after["tokens"]["real"] <= after["tokens"]["padded"]


def test_show_progress_splits_a_list_above_the_pending_limit_and_retries_busy_pieces(tmp_path, tiny_model):
    texts = random_texts(5000, seed=23)
    with running_server(tiny_model, "--num-worker", "1", "--max-pending-texts", "1500", tmp_path=tmp_path) as server:
        with server.client() as client:
            with pytest.raises(ServerError, match="split the request") as refused:
                client.encode(texts)
            assert refused.value.code == "too_large"
            result = client.encode(texts, show_progress=True, retries=30)
            busy = client.server_status["requests"]["busy"]
    assert busy > 0  # four 1024-text pieces do not fit under 1500: some were refused and sent again
    np.testing.assert_allclose(result[:50], reference_embeddings(tiny_model, texts[:50]), atol=1e-5)
    np.testing.assert_allclose(result[-50:], reference_embeddings(tiny_model, texts[-50:]), atol=1e-5)
    assert result.shape == (5000, 32)
