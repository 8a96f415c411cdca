"""The ventilator's books: what it has counted since it started, and the answers it builds from
them to SHOW_CONFIG and SHOW_STATUS. Pure."""
import functools
import time
from collections import Counter

from encoder_client.protocol import PROTOCOL_VERSION
from encoder_client.status import ModelStatus, Requests, ServerStatus, Texts
from encoder_client.version import __version__

from .metrics import Metrics


class Books:
    def __init__(self, settings):
        self.settings = settings
        self.models = settings.all_models  # the default model first
        self.workers_expected = sum(model.num_worker for model in self.models)
        self.started = time.monotonic()
        self.counts = Counter()  # requests_{outcome}, texts_{outcome}, jobs_redispatched, replies_dropped
        self.metrics = Metrics()  # the workers' (from their heartbeats) and the requests' latencies
        self.calibration = {}     # model index -> the int8 ranges its first worker sent

    def config(self):
        """SHOW_CONFIG's answer: the settings, and each embedding model's int8 ranges once a worker
        has calibrated them (as `calibration`: {"raw" or "normalized": [starts, steps]})."""
        models = [{**model, "calibration": self.calibration.get(index)}
                  for index, model in enumerate(self.settings_config["models"])]
        return {**self.settings_config, "calibration": self.calibration.get(0), "models": models}

    @functools.cached_property
    def settings_config(self):
        """The settings' part of SHOW_CONFIG: they never change, so it is built once (about 1 ms with two models)."""
        return {**self.settings.public_config(), "server_version": __version__,
                "protocol_version": PROTOCOL_VERSION}

    def status(self, dispatcher, liveness, draining):
        """SHOW_STATUS's answer, from these counts and the state of the ventilator's `dispatcher`
        (scheduling.Dispatcher) and `liveness` (liveness.Liveness)."""
        workers, counts = dispatcher.workers, self.counts
        return ServerStatus(
            ready=liveness.local >= self.workers_expected and not draining,
            workers_alive=len(workers),
            workers_expected=self.workers_expected,
            workers_remote=len(workers) - liveness.local,
            workers_busy=sum(1 for texts in workers.values() if texts),
            worker_busy_texts=workers,
            worker_texts_encoded=dispatcher.worker_texts_encoded,
            worker_restarts=liveness.restarts,
            jobs_redispatched=counts["jobs_redispatched"],
            queue_depth={**dispatcher.queue_depths(), "pending_texts": dispatcher.pending_texts,
                         "max_pending_texts": self.settings.max_pending_texts},
            in_flight_requests=dispatcher.in_flight_requests,
            requests_served=counts["requests_served"],
            requests={outcome: counts[f"requests_{outcome}"] for outcome in Requests.__annotations__},
            texts={outcome: dispatcher.texts_encoded if outcome == "encoded" else counts[f"texts_{outcome}"]
                   for outcome in Texts.__annotations__},
            replies_dropped=counts["replies_dropped"],
            draining=draining,
            uptime_s=round(time.monotonic() - self.started, 3),
            server_version=__version__,
            metrics=self.metrics.snapshot(),
            models={model.name: self._model_status(dispatcher, index, model)
                    for index, model in enumerate(self.models)},
        )

    @staticmethod
    def _model_status(dispatcher, index, model):
        alive = len(dispatcher.workers_of(index))
        depths = dispatcher.queue_depths(index)
        return ModelStatus(kind=model.kind, embedding_dim=model.embedding_dim, ready=alive >= model.num_worker,
                           workers_alive=alive, workers_expected=model.num_worker,
                           queue_depth={"priority": depths["priority"], "bulk": depths["bulk"]},
                           texts_encoded=dispatcher.texts_encoded_by_model[index])
