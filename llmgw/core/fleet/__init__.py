"""The live fleet: its records as the decisions see them, and the decisions read from them (health, autoscale, where a multi-node replica meets)."""
