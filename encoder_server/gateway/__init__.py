"""HTTP gateway to an encoder-server: OpenAI-compatible /v1/embeddings, bert-as-service's
/encode, Prometheus /metrics, /health, /ready and a live status page at / (app, serve), and the
Prometheus exporter of `--metrics-port` (metrics_exporter).

Importing this package loads nothing: the exporter's process never loads FastAPI or uvicorn."""
