"""encoder_server.server.books: the ventilator's answers to SHOW_CONFIG and SHOW_STATUS, from its
counts and a real Dispatcher and Liveness."""
from encoder_server.server.books import Books
from encoder_server.server.liveness import Liveness
from encoder_server.server.messages import Ready
from encoder_server.server.scheduling import Dispatcher
from encoder_server.settings import resolve

HOST = "this-host"


def test_config_gives_each_model_the_calibration_its_first_worker_sent(tiny_model):
    books = Books(resolve(model=str(tiny_model), num_worker=2))
    config = books.config()
    assert config["calibration"] is None and [model["calibration"] for model in config["models"]] == [None]
    ranges = {"raw": [[0.0] * 32, [1.0] * 32]}
    books.calibration[0] = ranges
    config = books.config()
    assert config["calibration"] == ranges and config["models"][0]["calibration"] == ranges
    assert config["num_worker"] == 2 and config["server_version"] and config["protocol_version"]


def test_status_counts_work_by_outcome_and_is_ready_with_every_local_worker_until_draining(tiny_model):
    books = Books(resolve(model=str(tiny_model), num_worker=2))
    dispatcher, liveness = Dispatcher(priority_batch_size=4, max_batch_size=8), Liveness(HOST)
    liveness.ready(b"w1", Ready(11, HOST), 0.0, over_ipc=True)
    dispatcher.add_worker(b"w1")
    assert not books.status(dispatcher, liveness, draining=False)["ready"]  # one worker of two

    liveness.ready(b"w2", Ready(12, HOST), 0.0, over_ipc=True)
    dispatcher.add_worker(b"w2")
    dispatcher.submit(1, b"client", ["a", "b", "c"], 0.0)
    for _, job in dispatcher.assignments(0.0):
        dispatcher.job_done(job.job_id)
    books.counts.update(requests_served=1, requests_expired=2, texts_expired=5, replies_dropped=1)
    status = books.status(dispatcher, liveness, draining=False)
    assert status["ready"] and status["workers_alive"] == status["workers_expected"] == 2
    assert status["requests"]["expired"] == 2 and status["requests"]["abandoned"] == 0
    assert status["texts"] == {"encoded": 3, "expired": 5, "abandoned": 0, "failed": 0, "refused": 0}
    assert status["requests_served"] == status["replies_dropped"] == 1
    model = status["models"][books.models[0].name]
    assert model["texts_encoded"] == 3 and model["ready"] and model["workers_alive"] == 2

    draining = books.status(dispatcher, liveness, draining=True)
    assert draining["draining"] and not draining["ready"]
