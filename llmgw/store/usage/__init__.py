"""Usage records on their way into the store (a router's local spool, the batched writer) and a window's summary read back out of it (what `llmgw plan` joins its changes with)."""
