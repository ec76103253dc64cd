"""Other APIs translated onto chat completions: one folder per API."""
