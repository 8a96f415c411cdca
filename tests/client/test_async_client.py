"""AsyncEncoderClient against a real server: concurrency on one client, errors, multicast, usage."""
import asyncio

import numpy as np
import pytest

from conftest import free_port, random_texts
from encoder_client import AsyncEncoderClient

pytestmark = pytest.mark.timeout(180)


def async_client(server, **kwargs):
    return AsyncEncoderClient("127.0.0.1", server.port, server.port_out, **{"timeout": 60, **kwargs})


def test_hundred_concurrent_encodes_on_one_client(tiny_server):
    corpora = [random_texts(1 + index % 40, seed=100 + index) for index in range(100)]
    with tiny_server.client() as client:
        expected = [client.encode(texts) for texts in corpora]

    async def run():
        async with async_client(tiny_server) as client:
            return await asyncio.gather(*(client.encode(texts) for texts in corpora))

    results = asyncio.run(run())
    assert len(results) == 100
    for got, want in zip(results, expected):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_token_counts_and_tokens(tiny_server):
    async def run():
        async with async_client(tiny_server) as client:
            short = await client.encode_result(["cat"])
            longer = await client.encode_result(["the big red cat", "dog"], show_tokens=True)
            return short, longer

    short, longer = asyncio.run(run())
    assert short.num_tokens == 3  # [CLS] cat [SEP]
    # each word of the tiny vocabulary is one token
    assert longer.num_tokens == sum(len(tokens) for tokens in longer.tokens) == 6 + 3
    assert longer.tokens[1] == ["[CLS]", "dog", "[SEP]"]


@pytest.mark.parametrize("texts, error, fragment", [
    ("just a string", TypeError, "must be a list"),
    ([], ValueError, "empty list"),
    (["ok", "  "], ValueError, "texts[1]"),
    (["ok", 3], TypeError, "texts[1]"),
])
def test_bad_input_raises_like_the_sync_client(tiny_server, texts, error, fragment):
    async def run():
        async with async_client(tiny_server) as client:
            with pytest.raises(error, match=fragment.replace("[", r"\[").replace("]", r"\]")):
                await client.encode(texts)
            return await client.encode(["still works"])  # the client survives bad input

    assert asyncio.run(run()).shape == (1, 32)


def test_connect_times_out_without_a_server():
    async def run():
        client = AsyncEncoderClient("127.0.0.1", free_port(), free_port(), timeout=0.5)
        try:
            with pytest.raises(TimeoutError, match="no answer"):
                await client.connect()
        finally:
            client.close()

    asyncio.run(run())


def test_closing_a_client_that_connects_ends_its_connect_at_once():
    """Another task closes the client while it waits for a server that is not there: its connect
    raises at once instead of retrying the closed client, without waiting, until its timeout."""
    from encoder_client.errors import ConnectionLostError

    async def run():
        client = AsyncEncoderClient("127.0.0.1", free_port(), free_port(), timeout=30)
        connecting = asyncio.ensure_future(client.connect())
        await asyncio.sleep(0.6)  # past a few of the handshake's retries
        loop = asyncio.get_running_loop()
        closed = loop.time()
        client.close()
        with pytest.raises(ConnectionLostError, match="closed"):
            await asyncio.wait_for(connecting, 5)
        return loop.time() - closed

    assert asyncio.run(run()) < 1.0


def test_listeners_sharing_an_identity_receive_every_result(tiny_server):
    batches = [random_texts(3, seed=seed) for seed in range(5)]

    async def run():
        async with async_client(tiny_server, identity="shared-async") as sender, \
                async_client(tiny_server, identity="shared-async") as listener:
            heard = []

            async def listen():
                async for req_id, embeddings in listener.listen():
                    heard.append(embeddings)
                    if len(heard) == len(batches):
                        return

            listening = asyncio.ensure_future(listen())
            await asyncio.sleep(0.2)
            sent = [await sender.encode(texts) for texts in batches]
            await asyncio.wait_for(listening, 30)
            return sent, heard

    sent, heard = asyncio.run(run())
    for got, want in zip(heard, sent):
        np.testing.assert_array_equal(got, want)


def test_status_and_config(tiny_server):
    async def run():
        async with async_client(tiny_server) as client:
            return await client.server_status(), await client.server_config()

    status, config = asyncio.run(run())
    assert status["workers_alive"] == 2
    assert config["model_name"] and config["max_batch_size"] == 32
