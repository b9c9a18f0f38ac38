"""What the bench, the fault runner and the tests share to drive the product from outside.

A private Redis with the product's clients on it (`private_redis`), worker pools started and
stopped with nothing left behind (`pools`), a client that follows a conversation as the page
does (`follow`), percentiles (`stats`), processes found and measured through psutil
(`processes`), polling for an event (`waiting`), the page in a real browser (`page`), and a
fleet on one machine: a redis-server on TCP (`tcp_redis`) with pools of `worker.py` and page
servers on it (`fleet`).
"""
