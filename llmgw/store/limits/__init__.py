"""Limits that hold across several routers: pooled shares, concurrency slots, the outage grace ledger."""
