"""Reading the input: the text column (and an id column) of a Parquet, JSONL or CSV file,
streamed in record batches through pyarrow, every row checked before any work starts."""
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from ..integrations.arrow import BadRowError, texts_of

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "json", ".ndjson": "json", ".csv": "csv"}
COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")
BATCH_ROWS = 8192


class InputError(ValueError):
    """The input cannot be embedded as asked; the message says why, naming the file and row."""


def input_format(path):
    suffixes = [suffix for suffix in Path(path).suffixes if suffix not in COMPRESSED]
    found = FORMATS.get(suffixes[-1].lower()) if suffixes else None
    if found is None:
        raise InputError(f"{path}: unknown format; the input must end in {', '.join(FORMATS)}")
    if found == "parquet" and Path(path).suffix in COMPRESSED:
        raise InputError(f"{path}: Parquet compresses inside the file; give it uncompressed")
    return found


def checked_batches(path, column, id_column=None):
    """Yield (record batch of the wanted columns, its first row number), each text checked:
    InputError names the first bad row (0-based, as the file's data rows are numbered)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    columns = [column] + ([id_column] if id_column and id_column != column else [])
    first = 0
    try:
        for batch in _batches(path, input_format(path), columns):
            try:
                texts_of(batch, column, range(first, first + batch.num_rows))
            except BadRowError as error:
                raise InputError(f"{path}: {error}") from None
            yield batch, first
            first += batch.num_rows
    except (pa.ArrowInvalid, OSError) as error:
        raise InputError(f"{path}: {_located(path, column, first, error)}") from None
    if first == 0:
        raise InputError(f"{path}: the file has no rows")


def _batches(path, kind, columns):
    if kind == "parquet":
        file = pq.ParquetFile(path)
        _require(path, columns, file.schema_arrow.names)
        yield from file.iter_batches(batch_size=BATCH_ROWS, columns=columns)
    elif kind == "csv":
        if path.stat().st_size == 0:
            return
        with pa_csv.open_csv(path) as probe:
            _require(path, columns, probe.schema.names)
        options = pa_csv.ConvertOptions(include_columns=columns, column_types={columns[0]: pa.string()})
        yield from pa_csv.open_csv(path, convert_options=options)
    else:
        if path.stat().st_size == 0:
            return
        yield from _json_batches(path, columns)


def _json_batches(path, columns):
    text = pa.schema([(columns[0], pa.string())])  # else ISO-8601 dates would be read as timestamps
    reader = pa_json.open_json(path, parse_options=pa_json.ParseOptions(explicit_schema=text))
    names_seen = False
    for batch in reader:
        if not names_seen:
            _require(path, columns, batch.schema.names)
            names_seen = True
        yield batch.select(columns)


def _require(path, columns, names):
    for name in columns:
        if name not in names:
            raise InputError(f"{path}: no column {name!r} (the columns are {', '.join(names) or 'none'})")


def _located(path, column, first, error):
    """pyarrow's error, with the row it happened at when pyarrow does not say (JSON lines: the
    first line from `first` on whose value is not a string)."""
    if input_format(path) == "json":
        try:
            with open(path, encoding="utf-8") as lines:
                for row, line in enumerate(lines):
                    if row < first or not line.strip():
                        continue
                    value = json.loads(line).get(column) if line.lstrip().startswith("{") else line
                    if not isinstance(value, str):
                        kind = "not a JSON object" if value is line else f"{type(value).__name__} {value!r:.60}"
                        return f"row {row}: {column!r} is {kind}, not text"
        except (ValueError, UnicodeDecodeError) as bad:
            return f"row {row}: not valid JSON ({bad})"
    return str(error).strip().splitlines()[0]
