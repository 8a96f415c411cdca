"""`encoder-server bulk`: embed a column of a Parquet, JSONL or CSV file into Parquet shards, on
Ray, resumably. `source` reads and checks the input, `shards` plans, writes and verifies the
output shards, `job` runs the shards on Ray and `command` is the command line's entry point."""

# the model's choices that a bulk job takes (`encoder-server bulk --pooling-strategy ...`)
MODEL_OPTIONS = ("model", "pooling_strategy", "pooling_layer", "max_seq_len", "normalize", "quantize", "backend",
                 "long_texts", "chunk_overlap")
REQUEST_OPTIONS = ("long_texts",)  # those a bulk job through a server (--connect) asks of each request
