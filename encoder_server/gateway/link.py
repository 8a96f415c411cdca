"""The gateway's one link to the encoder-server: it connects (retrying until the server answers),
polls the server's status every second, keeps recent samples, and gates and sends encode requests."""
import asyncio
import logging
import time
from collections import deque

from encoder_client.protocol import DEFAULT_MAX_REQUEST_MB
from encoder_client.request import max_request_bytes
from encoder_client.status import StatusError, check_status

from .errors import CLIENT_ERRORS, GatewayError, from_client_error
from .limits import RETRY_LATER

log = logging.getLogger("gateway")
POLL_INTERVAL = 1.0
STATUS_TIMEOUT = 3.0   # a status poll that takes longer counts as failed
STALE_AFTER = 5.0      # the server is "not answering" when no poll succeeded for this long
SAMPLES_KEPT_S = 65.0  # status samples kept for rates and recent latency


class ServerLink:
    def __init__(self, client_or_factory):
        self._client_or_factory = client_or_factory
        self._own_client = None  # the AsyncEncoderClient, from the start of `run`
        self.client = None       # the same, once connected
        self.closed = False
        self.config = {}         # the server's SHOW_CONFIG
        self.samples = deque()   # (monotonic time, status) of successful polls
        self.polled_at = None    # monotonic time of the last successful poll
        self.error = "not connected to the encoder-server yet"
        self.created = int(time.time())

    # ----- background task -----

    async def run(self):
        """Connect, then poll the status until cancelled or closed."""
        client = self._own_client = self._client_or_factory if hasattr(self._client_or_factory, "encode") \
            else self._client_or_factory()
        await self._connect(client)
        while not self.closed:
            await self.poll()
            await asyncio.sleep(POLL_INTERVAL)

    async def _connect(self, client):
        while not self.closed:
            try:
                await client.connect()
                async with asyncio.timeout(STATUS_TIMEOUT):
                    self.config = await client.server_config()
            except CLIENT_ERRORS as error:  # TimeoutError among them
                self.error = str(error)
                if not self.closed:
                    log.warning("%s; retrying", self.error)
                continue
            self.client = client
            log.info("connected to the encoder-server at %s (model %s)", client.address, self.model)
            return

    async def poll(self):
        try:
            async with asyncio.timeout(STATUS_TIMEOUT):
                status = check_status(await self.client.server_status())
        except CLIENT_ERRORS as error:
            self.error = f"the encoder-server is not answering: {error or 'no status reply'}"
            return
        except StatusError as error:
            self.error = f"the encoder-server's status does not follow this gateway's version: {error}"
            log.error(self.error)
            return
        now = time.monotonic()
        if self.status and status["uptime_s"] < self.status["uptime_s"]:
            self.samples.clear()  # the server restarted: its counters began again
            await self._refresh_config()
        self.samples.append((now, status))
        while now - self.samples[0][0] > SAMPLES_KEPT_S:
            self.samples.popleft()
        self.polled_at, self.error = now, None

    async def _refresh_config(self):
        try:
            async with asyncio.timeout(STATUS_TIMEOUT):
                self.config = await self.client.server_config()
        except CLIENT_ERRORS:
            pass  # the next restart check, or the next gateway start, will fetch it

    def close(self):
        """Close the client and end `run` at its next step, even where a cancellation of it is lost."""
        self.closed = True
        if self._own_client is not None:
            self._own_client.close()

    # ----- what the routes read -----

    @property
    def status(self):
        """The latest status, or None while the server does not answer."""
        return self.samples[-1][1] if self.samples and self.reachable else None

    @property
    def reachable(self):
        return self.polled_at is not None and time.monotonic() - self.polled_at < STALE_AFTER

    @property
    def model(self):
        return self.config.get("model_name") or self.config.get("model")

    @property
    def models(self):
        """Each served model's SHOW_CONFIG entry, the default first ([] until connected)."""
        return self.config.get("models") or ([self.config] if self.config else [])

    @property
    def model_names(self):
        """Every name of every model: each one's served name first, then its aliases."""
        return [name for model in self.models for name in model.get("model_names") or [model.get("model_name")]]

    def model_named(self, name):
        """The config entry of the model answering to `name`; None when none does."""
        return next((model for model in self.models if name in (model.get("model_names") or [])), None)

    def first_of_kind(self, kind):
        """The config entry of the first model of `kind` (embed or rerank); None when none is."""
        return next((model for model in self.models if model.get("kind", "embed") == kind), None)

    @property
    def max_request_bytes(self):
        """The largest request the server takes (its default until it has said)."""
        return max_request_bytes(self.config) or DEFAULT_MAX_REQUEST_MB << 20

    def unavailable(self):
        """Why encode requests cannot be served now (None when they can)."""
        if self.client is None or not self.reachable:
            return self.error or "the encoder-server is not answering"
        status = self.status
        if status["draining"]:
            return "the encoder-server is shutting down"
        if not status["workers_alive"]:
            return (f"no worker of the encoder-server is alive (0 of {status['workers_expected']}); "
                    "they are being restarted, retry shortly")
        return None

    def not_ready(self):
        """Why /ready says no (None when ready)."""
        reason = self.unavailable()
        if reason is None and not self.status["ready"]:
            reason = f"{self.status['workers_alive']} of {self.status['workers_expected']} workers alive"
        return reason

    async def encode(self, texts, is_tokenized=False, **model_options):
        """The server's EncodeResult for `texts`; a GatewayError when it cannot be had.
        `model_options`: encoder_client.request.MODEL_OPTIONS (None: the server's default)."""
        reason = self.unavailable()
        if reason is not None:
            raise GatewayError(503, reason, code="server_unavailable", headers=RETRY_LATER)
        try:
            return await self.client.encode_result(texts, is_tokenized=is_tokenized, **model_options)
        except CLIENT_ERRORS as error:
            raise from_client_error(error) from None
