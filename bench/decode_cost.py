"""CPU seconds to decode one 8 MiB reply, with a key set, one string redacted at a time against in
bulk and in steps (agent/providers/sliced_json.py): `python -m bench.decode_cost`.

Bodies: 1.7 million two-letter strings (the shape reported), and about 90,000 strings that each echo
the key written fullwidth (every one must be redacted). CPU time of this process, best of three, the
collector paused, so a busy neighbour does not count.
"""

from __future__ import annotations

import gc
import json
import time

from agent.providers.http import redact_json
from agent.providers.sliced_json import decode_steps
from agent.text.surrogates import scrub_json

KEY = "sk-bench-0123456789abcdef"
BODY_BYTES = 8 * 2**20


def bodies() -> dict[str, bytes]:
    wide = "".join(chr(ord(char) + 0xFEE0) for char in KEY)
    reply = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}
    short = json.dumps({**reply, "pad": ["ab"] * (BODY_BYTES // 5 - 20)}, separators=(",", ":")).encode()
    echo = json.dumps({**reply, "echo": [wide + " x"] * (BODY_BYTES // 90)}, ensure_ascii=False).encode()
    return {"1.7 M short strings": short, "the key echoed 90 k times": echo}


def one_at_a_time(body: bytes, secret: str | None):
    return redact_json(scrub_json(json.loads(body)), secret)


def stepwise(body: bytes, secret: str | None):
    steps = decode_steps(body, secret)
    count = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, count
        count += 1


def cpu_s(function, *args, repeats: int = 3) -> float:
    best = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            started = time.process_time()
            function(*args)
            best = min(best, time.process_time() - started)
    finally:
        gc.enable()
    return best


def main() -> None:
    for name, body in bodies().items():
        before = cpu_s(one_at_a_time, body, KEY)
        after = cpu_s(stepwise, body, KEY)
        plain = cpu_s(json.loads, body)
        steps = stepwise(body, KEY)[1]
        print(f"{name} ({len(body) / 2**20:.1f} MiB): one string at a time {before:.2f} s, in bulk and in steps "
              f"{after:.2f} s ({steps} steps, {1000 * after / max(steps, 1):.1f} ms each on average); "
              f"json.loads alone {plain:.2f} s")


if __name__ == "__main__":
    main()
