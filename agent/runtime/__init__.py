"""The runtime: embedded Redis, the connections to it, the worker pool and its workers."""
