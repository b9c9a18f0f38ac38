"""The hosting: what runs the product. The worker pool, its RQ worker processes, and the services
(Redis and the pool) the page and the CLI start once per process. It imports the product and the
runtime's plumbing (agent/runtime/); only the top imports it: the page, the CLIs, worker.py, dashboard.py."""
