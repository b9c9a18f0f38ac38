"""The `demo` provider: the offline scripted model (agent/demo), whose OpenAI-compatible server the
worker pool runs on loopback and names to its workers in AGENT_DEMO_URL."""

from __future__ import annotations

from agent.demo.scenarios import MODEL_PREFIX
from agent.providers.openai import OpenAIProvider
from agent.providers.spec import ProviderSpec

DEMO = ProviderSpec(
    name="demo",
    client=OpenAIProvider,
    default_model=MODEL_PREFIX,  # the healthy scenario, at its default latency
    url_variable="AGENT_DEMO_URL",
    label="demo (offline, built in)",
    served_by_pool=True,
)
