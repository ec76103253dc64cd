"""A running controller's views and operations: status, restart, drain, logs, doctor, evals, requests, audit, weights."""
