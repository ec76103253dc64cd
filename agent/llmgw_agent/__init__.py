"""llmgw's node agent: inventory, engine supervision, weights, and the simulated engine."""

__version__ = "0.1.0"
