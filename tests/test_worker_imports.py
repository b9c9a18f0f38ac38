"""A worker imports what it uses: the MCP SDK only once a server is configured, the OpenTelemetry SDK's
trace exporter only once tracing is on, and never the demo model, which runs in the pool's demo provider."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

PROBE = """
import json, sys
import agent.hosting.worker_process
from agent.tools import sources
sources.load(jobs_in_process=True)
sources.close()
print(json.dumps({name: name in sys.modules for name in ("mcp", "anyio", "opentelemetry.exporter.otlp.proto.http",
                                                         "agent.demo.model")}))
"""


def loaded_modules(env: dict) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_worker_without_mcp_servers_or_tracing_never_imports_their_sdks(base_env):
    loaded = loaded_modules({**base_env, "AGENT_MCP_CONFIG": "off"})
    assert {name: loaded[name] for name in ("mcp", "anyio", "opentelemetry.exporter.otlp.proto.http")} == {
        "mcp": False, "anyio": False, "opentelemetry.exporter.otlp.proto.http": False}


def test_a_worker_names_the_demo_model_but_never_imports_it(base_env):
    assert loaded_modules({**base_env, "AGENT_MCP_CONFIG": "off"})["agent.demo.model"] is False


def test_a_worker_with_the_default_mcp_json_imports_the_mcp_sdk(base_env):
    env = {key: value for key, value in base_env.items() if key != "AGENT_MCP_CONFIG"}
    assert loaded_modules(env)["mcp"] is True
