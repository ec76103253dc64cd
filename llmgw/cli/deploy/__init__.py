"""Putting llmgw on machines: `llmgw up`, `node add|bootstrap`, `upgrade`."""
