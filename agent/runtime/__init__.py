"""The runtime's plumbing: embedded Redis, the connections to it, loopback servers, children that die
with their parent, and the workers' logs. The product imports it; the hosting (agent/hosting/) builds on it."""
