"""encoder_server.integrations.ray on a real local Ray: both modes give the rows a direct encode
gives, in input order, and an actor killed mid-run (Ray restarts it and retries its batch) loses
and duplicates nothing. Skipped as a whole when Ray is not installed."""
import os
import signal
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the `ray` extra is not installed")
pa = pytest.importorskip("pyarrow")

import psutil  # noqa: E402

from conftest import random_texts, running_server  # noqa: E402
from encoder_server.model import load  # noqa: E402
from encoder_server.integrations.arrow import BadRowError, matrix_of  # noqa: E402
from encoder_server.integrations.ray import Embed, embed_dataset  # noqa: E402

BATCH = 40


@pytest.fixture(scope="module")
def local_ray(ray_head):
    import ray.data

    ray.init(address=ray_head, log_to_driver=False, logging_level="ERROR")
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.execution_options.preserve_order = True
    yield ray
    ray.shutdown()


def dataset(texts, blocks=1):
    import ray.data

    table = pa.table({"text": texts, "n": list(range(len(texts)))})
    size = -(-len(texts) // blocks)
    return ray.data.from_arrow([table.slice(start, size) for start in range(0, len(texts), size)])


def collected(embedded):
    table = pa.concat_tables(ray.get(embedded.to_arrow_refs()))
    return table, matrix_of(table.column("embedding"))


def per_batch(encode, texts):
    """What a direct encode gives for each of Ray's batches (consecutive runs of BATCH rows)."""
    return np.concatenate([encode(texts[start:start + BATCH]) for start in range(0, len(texts), BATCH)])


def test_in_process_rows_equal_a_direct_encode_in_input_order(local_ray, tiny_model):
    texts = random_texts(300, seed=11)
    table, rows = collected(embed_dataset(dataset(texts), model=str(tiny_model), actors=2, batch_size=BATCH))
    assert table.column("n").to_pylist() == list(range(len(texts)))
    assert table.column("text").to_pylist() == texts
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 32)
    direct = load(str(tiny_model), threads_per_worker=1)
    assert np.array_equal(rows, per_batch(direct.embed_texts, texts))


def test_as_a_client_of_a_server_rows_equal_its_own_encode(local_ray, tiny_model, tmp_path):
    texts = random_texts(200, seed=12)
    with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path) as server:
        embedded = embed_dataset(dataset(texts), address="127.0.0.1", port=server.port, port_out=server.port_out,
                                 timeout=60, actors=2, batch_size=BATCH)
        table, rows = collected(embedded)
        with server.client() as client:
            expected = per_batch(client.encode, texts)
    assert table.column("n").to_pylist() == list(range(len(texts)))
    assert np.array_equal(rows, expected)


def embed_actor_pids():
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if "MapBatches(Embed)" in " ".join(process.info["cmdline"] or []):
            found.append(process.pid)
    return found


def test_an_actor_killed_mid_run_loses_and_duplicates_no_row(local_ray, tiny_model):
    # enough batches that the killer's scan of the process table (slow on a loaded machine) finds an
    # actor while one of its tasks runs
    texts = random_texts(10000, seed=13, min_words=20, max_words=40)
    killed = []

    def kill_one_actor_once_running():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            pids = embed_actor_pids()
            if pids:
                time.sleep(1.0)                       # let it load the model and take a batch
                try:
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(pids[0])
                except ProcessLookupError:            # it ended meanwhile (Ray let it go): look again
                    pass
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_actor_once_running)
    killer.start()
    table, rows = collected(embed_dataset(dataset(texts, blocks=16), model=str(tiny_model), actors=2,
                                          batch_size=BATCH))
    killer.join()
    assert killed, "no actor was found to kill"
    assert table.column("n").to_pylist() == list(range(len(texts)))
    direct = load(str(tiny_model), threads_per_worker=1).embed_texts(texts)
    np.testing.assert_allclose(rows, direct, atol=1e-5)


def test_a_bad_value_is_named_by_its_row(tiny_model):
    embed = Embed(model=str(tiny_model))
    for values, expected in ((["fine", None, "fine"], "row 1: column 'text' is empty (null)"),
                             (["fine", "   "], "row 1 is empty or whitespace-only"),
                             ([1, 2], "row 0: 1 is not text; column 'text' holds int64")):
        with pytest.raises(BadRowError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            embed(pa.table({"text": values}))
    with pytest.raises(BadRowError, match="no column 'text' \\(the columns are body\\)"):
        embed(pa.table({"body": ["x"]}))
