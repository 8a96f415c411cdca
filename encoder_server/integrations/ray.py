"""Embedding on Ray Data (the `ray` extra: pip install "encoder-server[ray]").

`Embed` is a callable class for `Dataset.map_batches`: each actor embeds one column of its
batches and adds the embeddings as a fixed_size_list<float32> column, rows in input order. It
runs the model in the actor (an `Embedder` whose threads are the actor's CPUs), or, given
`address`, sends the texts to a running encoder-server.

    import ray
    from encoder_server.integrations.ray import embed_dataset
    embedded = embed_dataset(ray.data.read_parquet("docs.parquet"), column="text", actors=4)
"""
import functools

import ray
import ray.data

from encoder_client.protocol import DEFAULT_PORT, DEFAULT_PORT_OUT

from .arrow import embedding_column, texts_of

BATCH_ROWS = 256


class Embed:
    """Use with `map_batches(Embed, fn_constructor_kwargs={...}, batch_format="pyarrow", ...)`.

    In-process (no `address`): `model` is a model folder (default: the bundled all-MiniLM-L6-v2),
    `choices` are `encoder-server start`'s options as keywords (pooling_strategy="cls",
    quantize="int8", ...). As a client: `address` is the server's host, with its `port`,
    `port_out`, `timeout` and CURVE `server_key`/`client_key` files as for EncoderClient, and of the
    choices only `long_texts`, which each request carries (the others are the server's)."""

    def __init__(self, column="text", output_column="embedding", *, address=None, port=DEFAULT_PORT,
                 port_out=DEFAULT_PORT_OUT, timeout=600, server_key=None, client_key=None, model=None, **choices):
        self.column, self.output_column = column, output_column
        if address is None:
            from ..model import load
            choices.setdefault("threads_per_worker", actor_cpus())
            self._embedder = load(model, **choices)
            self._encode = self._embedder.embed_texts
        else:
            from encoder_client import EncoderClient
            self._client = EncoderClient(address, port, port_out, timeout=timeout, server_key=server_key,
                                         client_key=client_key)
            self._encode = functools.partial(self._client.encode, long_texts=choices.get("long_texts"))

    def __call__(self, batch):
        """A pyarrow Table (or a dict of columns) in; the same with the embedding column added."""
        table = _as_table(batch)
        if len(table) == 0:
            return table.append_column(self.output_column, embedding_column(_empty(self.dimension)))
        return table.append_column(self.output_column, embedding_column(self._encode(texts_of(table, self.column))))

    @property
    def dimension(self):
        if hasattr(self, "_embedder"):
            return self._embedder.dimension
        return self._client.server_config["embedding_dim"]


def embed_dataset(dataset, column="text", *, output_column="embedding", actors=None, cpus_per_actor=None,
                  batch_size=BATCH_ROWS, **embed_options):
    """`dataset` with an embedding column, computed by a pool of `actors` (default: as many as the
    cluster's CPUs allow) of `cpus_per_actor` CPUs each (default 1 in-process, 0.25 as a client,
    which only waits on the server). `embed_options` go to `Embed`."""
    client = embed_options.get("address") is not None
    cpus = cpus_per_actor or (0.25 if client else 1)
    actors = actors or max(1, int(ray.cluster_resources().get("CPU", 1) // cpus))
    return dataset.map_batches(Embed, fn_constructor_kwargs=dict(column=column, output_column=output_column,
                                                                 **embed_options),
                               compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=cpus,
                               batch_size=batch_size, batch_format="pyarrow")


def actor_cpus():
    """Whole CPUs that Ray gave this actor or task (at least 1); outside Ray, 1."""
    try:
        assigned = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
    except Exception:  # noqa: BLE001 - not inside a Ray worker
        assigned = 1
    return max(1, int(assigned))


def _as_table(batch):
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, dict):
        return pa.table({name: pa.array(list(values)) for name, values in batch.items()})
    raise TypeError(f"Embed takes batch_format='pyarrow' (or 'numpy'), got {type(batch).__name__}")


def _empty(dimension):
    import numpy as np

    return np.zeros((0, dimension), dtype=np.float32)
