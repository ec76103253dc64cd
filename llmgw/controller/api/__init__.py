"""The admin HTTP API: the route table, the scope check, the handlers (one module per subject)."""
