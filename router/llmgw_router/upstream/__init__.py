"""HTTP out: engines and providers, and the egress check on every connection."""
