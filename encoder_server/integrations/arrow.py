"""Arrow columns in and out: the texts of a column, checked row by row, and embeddings as a
fixed-size-list column of float32 (one list of `dimension` floats per row)."""
import numpy as np
import pyarrow as pa

from encoder_client.validation import check_not_blank, check_unicode

TEXT_TYPES = (pa.string(), pa.large_string(), pa.string_view())


class BadRowError(ValueError):
    """A value that cannot be embedded; the message names its row."""


def texts_of(table, column, row_names=None):
    """The column's values as a list of str. BadRowError names the first row that is missing,
    not text, empty or not valid Unicode: by `row_names[i]` when given (the input's row numbers),
    else by its position in `table`."""
    if column not in table.column_names:
        raise BadRowError(f"no column {column!r} (the columns are {', '.join(table.column_names) or 'none'})")
    values = table.column(column)
    name = (lambda i: row_names[i]) if row_names is not None else (lambda i: i)
    if values.type not in TEXT_TYPES:
        where = next((i for i, value in enumerate(values) if value.is_valid), None)
        found = "" if where is None else f"row {name(where)}: {values[where].as_py()!r:.60} is not text; "
        raise BadRowError(f"{found}column {column!r} holds {values.type}, not strings")
    texts = values.to_pylist()
    for i, text in enumerate(texts):
        if text is None:
            raise BadRowError(f"row {name(i)}: column {column!r} is empty (null)")
        try:
            check_unicode(text, f"row {name(i)}")
            check_not_blank(text, f"row {name(i)}")
        except ValueError as error:
            raise BadRowError(str(error)) from None
    return texts


def embedding_column(matrix):
    """A [rows, dimension] float32 array as a fixed_size_list<float32>[dimension] array (no copy)."""
    matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"embeddings must be one vector per row, got shape {matrix.shape} (token-level pooling "
                         f"does not fit a column)")
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


def matrix_of(column):
    """A fixed-size-list column back as a [rows, dimension] float32 array."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), column.type.list_size)
