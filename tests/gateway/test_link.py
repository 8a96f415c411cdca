"""encoder_server.gateway.link: the gateway's link ends when closed, even with no server to answer and
no cancellation reaching its task (asyncio.wait_for before Python 3.12 can drop one), so that the
gateway's shutdown never waits on it."""
import asyncio

from conftest import free_port
from encoder_client import AsyncEncoderClient
from encoder_server.gateway.link import ServerLink


def test_a_closed_link_ends_its_task_without_a_server_or_a_cancellation():
    async def run():
        link = ServerLink(lambda: AsyncEncoderClient("127.0.0.1", free_port(), free_port(), timeout=30))
        task = asyncio.ensure_future(link.run())
        await asyncio.sleep(0.6)  # connecting: the handshake retried a few times
        assert not task.done() and link.error == "not connected to the encoder-server yet"
        link.close()
        await asyncio.wait_for(task, 2)  # ends by itself: never cancelled
        return link

    link = asyncio.run(run())
    assert link.client is None and "closed" in link.error
