"""Where an API key may go: the configured server, or this machine by loopback IP literal or `localhost`.

A turn's config (its base_url included) comes from Redis, so whoever can write there chooses the
server a worker calls. The rule is fuzzed with look-alike hosts; a real worker pool behind a
recording HTTP proxy shows that no forged server gets the key, and that the chat says why.
"""

from __future__ import annotations

import ipaddress
import itertools

import httpx
import pytest

from agent.hosts import is_local_host, is_local_url
from agent.providers import ProviderError, make_provider
from agent.settings import TurnConfig
from harness.pools import stop_pool
from tests.conftest import CANARY_KEY, FAST, ask, start_pool, wait_done
from tests.scripted_server import ScriptedServer, chat_reply

LOOPBACK_HOSTS = ["127.0.0.1", "127.0.0.2", "127.255.255.254", "localhost", "LOCALHOST", "LocalHost", "[::1]",
                  "[0:0:0:0:0:0:0:1]"]
PORTS = ["", ":1", ":18081", ":65535"]
TAILS = [".evil.test", ".evil.test.", ".", "..", ".nip.io", "%2eevil.test", "\u3002evil.test", "\uff0eevil.test",
         "-evil.test", "_evil", ".localhost", ".127.0.0.1", "%00.evil.test", ".evil.test%23"]
# Names and shorthands that some resolvers read as loopback, but that are not IP literals.
SHORTHANDS = ["127.1", "127.0.1", "0x7f.0.0.1", "0x7f000001", "2130706433", "0177.0.0.1", "017700000001",
              "127.000.000.001", "localhost.", "localhost..", "local host", "lo%63alhost", "%31%32%37.0.0.1",
              "1\uff12\uff17.0.0.1", "127\u3002\u0030\u3002\u0030\u3002\u0031", "\u217c\u2170calhost",
              "[::ffff:127.0.0.1]", "[::1%25eth0]x", "[::1].evil.test", "127.0.0.1 .evil.test",
              "127.0.0.1\t", "127.0.0.1\n.evil.test"]


def look_alike_urls() -> list[str]:
    """Many URLs whose host looks like this machine but is not, or whose parts URL parsers disagree on."""
    urls = []
    for host, tail, port in itertools.product(LOOPBACK_HOSTS, TAILS, PORTS):
        urls.append(f"http://{host}{tail}{port}/v1")
    for host, port in itertools.product(SHORTHANDS, PORTS):
        urls.append(f"http://{host}{port}/v1")
    for host in LOOPBACK_HOSTS:
        urls += [
            f"http://{host}@evil.test/v1",
            f"http://user:{host}@evil.test/v1",
            f"http://{host}:80@evil.test/v1",
            f"http://evil.test#@{host}/v1",
            f"http://evil.test?@{host}/v1",
            f"http://evil.test\\@{host}/v1",
            f"http://evil.test\\\\{host}/v1",
            f"http://evil.test%40{host}/v1",
            f"http://evil.test@{host}/v1",  # a local host, but user info is refused outright: parsers disagree on it
            f"https://evil.test:443@{host}/v1",
            f"http://{host}:8080:evil.test/v1",
            f"http://{host}:99999/v1",
            f"ftp://{host}/v1",
            f"//{host}/v1",
            f"{host}/v1",
            f" http://{host}/v1",
            f"http://{host}/v1\r\nHost: evil.test",
            f"HTTP://{host.upper()}.EVIL.TEST/v1",
        ]
    urls += ["http://evil.test/v1", "https://api.openai.com.evil.test/v1", "http:///127.0.0.1/v1", "http:127.0.0.1/v1",
             "", "http://", "http://[::1/v1", "http://[127.0.0.1]/v1"]
    return urls


LOCAL_URLS = [f"{scheme}://{host}{port}/v1" for scheme, host, port in
              itertools.product(["http", "https", "HTTP"], LOOPBACK_HOSTS, PORTS)]


def test_look_alike_hosts_are_never_local():
    urls = look_alike_urls()
    assert len(urls) > 500
    assert [url for url in urls if is_local_url(url)] == []


def test_loopback_literals_and_localhost_are_local_in_any_case_and_with_any_port():
    assert all(is_local_url(url) for url in LOCAL_URLS), [u for u in LOCAL_URLS if not is_local_url(u)]
    assert is_local_host("::1") and is_local_host("[::1]") and is_local_host("127.9.9.9")
    assert not is_local_host("") and not is_local_host(None) and not is_local_host("localhost.")


def test_whenever_the_rule_says_local_the_http_client_connects_to_a_loopback_host():
    """The rule and httpx must agree on the host, or a URL parsed two ways could send the key away."""
    for url in look_alike_urls() + LOCAL_URLS:
        if not is_local_url(url):
            continue
        host = httpx.URL(url + "/chat/completions").host
        assert host == "localhost" or ipaddress.ip_address(host).is_loopback, (url, host)


def test_a_key_is_refused_for_every_look_alike_server_and_the_reason_names_it(tmp_path):
    env = {"OPENAI_API_KEY": CANARY_KEY, "ANTHROPIC_API_KEY": CANARY_KEY}
    for provider, url in itertools.product(["openai", "anthropic"], look_alike_urls()[::7]):
        config = TurnConfig(provider=provider, model="m", base_url=url)
        if not url:
            continue  # "" means the configured server
        with pytest.raises(ProviderError) as info:
            make_provider(config, env=env, project_root=tmp_path)
        assert "was not sent" in info.value.message and url in info.value.message
        assert CANARY_KEY not in info.value.message


def test_the_configured_server_and_this_machine_get_the_key(tmp_path):
    env = {"OPENAI_API_KEY": CANARY_KEY, "OPENAI_BASE_URL": "https://models.example.test/v1"}
    for url in ["https://models.example.test/v1", "https://models.example.test/v1/", None] + LOCAL_URLS:
        provider = make_provider(TurnConfig(provider="openai", model="m", base_url=url), env=env, project_root=tmp_path)
        assert provider._api_key == CANARY_KEY


# -- end to end: real workers behind a recording proxy ------------------------------------------

CONFIGURED_URL = "http://models.example.test/v1"  # reached only through the proxy below
FORGED_URLS = [
    "http://127.0.0.1.evil.test:18081/v1",
    "http://localhost.evil.test/v1",
    "http://127.1.evil/v1",
    "http://0x7f.evil/v1",
    "http://127.0.0.1@evil.test/v1",
    "http://LOCALHOST.EVIL.TEST:8080/v1",
    "http://127.0.0.1%2eevil.test/v1",
    "http://127.0.0.1.:18081/v1",
]


@pytest.fixture
def proxied_pool(private_redis, tmp_path):
    """A private Redis and two workers whose HTTP goes through a recording proxy (loopback excepted),
    which stands for every machine on the network: whatever reaches it left this machine."""
    with ScriptedServer(default=chat_reply("answered by the configured server")) as proxy:
        env = {"HTTP_PROXY": proxy.url, "http_proxy": proxy.url, "HTTPS_PROXY": proxy.url, "https_proxy": proxy.url,
               "ALL_PROXY": None, "all_proxy": None, "NO_PROXY": "127.0.0.1,localhost,::1",
               "no_proxy": "127.0.0.1,localhost,::1", "OPENAI_BASE_URL": CONFIGURED_URL}
        handle = start_pool(private_redis.url, 2, tmp_path / "pool.log", extra_env=env)
        try:
            yield private_redis.store, private_redis.queue, proxy, handle
        finally:
            stop_pool(handle, private_redis.url)


def test_no_forged_server_gets_the_key_and_the_chat_says_why(proxied_pool):
    store, queue, proxy, handle = proxied_pool
    config = FAST.with_changes(provider="openai", model="remote", job_timeout_s=10)
    # The control: the configured server, reached through the proxy, gets the key.
    control = wait_done(store, ask(store, queue, "hi", config), timeout_s=60)
    assert control["status"] == "done", control
    assert [r.headers.get("authorization") for r in proxy.requests] == [f"Bearer {CANARY_KEY}"]
    assert proxy.requests[0].path == CONFIGURED_URL + "/chat/completions"
    for url in FORGED_URLS:
        state = wait_done(store, ask(store, queue, "hi", config.with_changes(base_url=url)), timeout_s=30)
        ending = state["history"][-1]["content"]
        assert state["status"] == "failed", (url, ending)
        assert f"server {url} is not the configured server" in ending and "was not sent" in ending, ending
        assert "Something went wrong" not in ending
    assert len(proxy.requests) == 1, [(r.path, r.headers.get("authorization")) for r in proxy.requests]
    assert CANARY_KEY not in handle.log_path.read_text(errors="replace")
