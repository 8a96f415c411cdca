"""The output folder: a plan of fixed-size shards, each written as part-NNNNN.parquet in one
atomic rename and verified from its footer, so a rerun skips exactly the finished shards.

OUTPUT/_texts.parquet   the checked input: id, text (and the id column), one row group per shard
OUTPUT/_bulk.json       what this folder embeds: the input, its size and time, the options, rows
OUTPUT/part-NNNNN.parquet  rows [N * shard_rows, (N + 1) * shard_rows): id and embedding
"""
import json
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow.parquet as pq

TEXTS = "_texts.parquet"
MANIFEST = "_bulk.json"
METADATA_KEY = b"encoder_server.bulk"


class OutputError(ValueError):
    """The output folder belongs to another job, or cannot be written."""


@dataclass(frozen=True)
class Plan:
    """What a folder embeds; a rerun must agree on all of it to reuse the folder's shards."""
    input: str
    input_size: int
    input_mtime_ns: int
    column: str
    id_column: str | None
    options: dict
    shard_rows: int
    rows: int = 0

    @property
    def shards(self):
        return -(-self.rows // self.shard_rows)

    def rows_of(self, shard):
        return min(self.shard_rows, self.rows - shard * self.shard_rows)

    def same_job(self, other):
        return asdict(self) | {"rows": 0} == asdict(other) | {"rows": 0}


def shard_path(output, shard):
    return Path(output) / f"part-{shard:05d}.parquet"


def read_manifest(output):
    try:
        return Plan(**json.loads((Path(output) / MANIFEST).read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as error:
        raise OutputError(f"{output}/{MANIFEST} is damaged ({error}); remove the folder to start again") from None


def write_manifest(output, plan):
    atomic_write(Path(output) / MANIFEST, lambda path: path.write_text(json.dumps(asdict(plan), indent=1)))


def atomic_write(target, write):
    """`write(path)` to a temporary name beside `target`, flushed to disk, then renamed over it:
    `target` is either absent, its old self, or whole."""
    target = Path(target)
    staging = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(staging)
        with open(staging, "rb") as written:
            os.fsync(written.fileno())
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)


def remove_leftovers(output):
    """Temporary files of writes that a killed run never finished. A run sweeps them when it starts
    and once every shard is written: a killed run's Ray actors die a few seconds after their driver,
    and one killed while writing leaves its file behind in the meantime."""
    for leftover in Path(output).glob(".*.tmp"):
        leftover.unlink(missing_ok=True)


def write_shard(output, plan, shard, table):
    """The shard's rows, tagged in the file's metadata with the shard it is and its row count."""
    tag = json.dumps({"shard": shard, "rows": table.num_rows, "first_id": shard * plan.shard_rows}).encode()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), METADATA_KEY: tag})
    atomic_write(shard_path(output, shard), lambda path: pq.write_table(table, path))


def shard_is_done(output, plan, shard):
    """Whether part-NNNNN.parquet is whole (its footer reads) and holds this shard's rows."""
    try:
        metadata = pq.read_metadata(shard_path(output, shard))
        tag = json.loads(metadata.metadata[METADATA_KEY])
    except (OSError, KeyError, TypeError, ValueError):
        return False
    expected = {"shard": shard, "rows": plan.rows_of(shard), "first_id": shard * plan.shard_rows}
    return tag == expected and metadata.num_rows == expected["rows"]


def pending_shards(output, plan):
    return [shard for shard in range(plan.shards) if not shard_is_done(output, plan, shard)]
