"""`llmgw server init`: a control plane installed on the machine it runs on, step by step."""
