"""HTTP in: the listener, the exchange a request path sees, refusals as HTTP answers."""
