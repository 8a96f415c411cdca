"""The service's processes, each loop beside its pure logic: the supervisor (supervisor,
worker_pool), the ventilator (intake, scheduling, liveness), the workers (batching; the model is
encoder_server.model), the sink (assembly, subscriptions, ownership, backlog), workers on other
hosts (remote_worker); the internal messages between them (messages, metrics) and their sockets."""
