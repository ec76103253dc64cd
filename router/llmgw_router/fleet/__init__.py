"""What the router knows of its endpoints (the routing table, scrapes, KV events), and what it tells."""
