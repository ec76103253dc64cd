"""The request path, stage by stage: the orchestrator (service) and each stage it calls in turn."""
