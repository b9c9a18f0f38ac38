"""Provider calls made in a child process of their own, so a test can read that process's peak memory.

    python -m tests.bounded_calls < calls.json

stdin: {"url": base URL, "address_space_bytes": a cap (a runaway allocation fails here, not the
machine), "calls": [{"limit_bytes": ..., "total_s": ...}, ...]}. Prints one JSON line per call
(outcome, elapsed time, peak RSS so far), in order.
"""

from __future__ import annotations

import json
import resource
import sys
import time


def main() -> None:
    spec = json.load(sys.stdin)
    cap = spec["address_space_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    from agent.deadline import CallTimeout
    from agent.providers import OpenAIProvider, ProviderError
    from agent.providers import http as provider_http

    provider = OpenAIProvider(spec["url"] + "/v1", "m", None)
    for call in spec["calls"]:
        provider_http.MAX_RESPONSE_BYTES = call["limit_bytes"]
        started = time.monotonic()
        try:
            completion = provider.complete([{"role": "user", "content": "hi"}], [], CallTimeout(call["total_s"], 2.0))
            outcome = {"ok": True, "content": completion.content}
        except ProviderError as exc:
            outcome = {"ok": False, "kind": exc.kind, "message": exc.message}
        except MemoryError:
            outcome = {"ok": False, "kind": "MemoryError", "message": "out of the address space cap"}
        outcome["elapsed_s"] = time.monotonic() - started
        outcome["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
