"""The agent tests' fixtures (a fake controller, the agent processes a test starts), for tests here that run a
real agent."""

from agent.conftest import agents, ctl  # noqa: F401  (registers the fixtures)
