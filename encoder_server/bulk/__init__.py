"""`encoder-server bulk`: embed a column of a Parquet, JSONL or CSV file into Parquet shards, on
Ray, resumably. `source` reads and checks the input, `shards` plans, writes and verifies the
output shards, `job` runs the shards on Ray and `command` is the command line's entry point."""
