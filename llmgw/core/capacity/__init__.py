"""What one replica serves: measured by `llmgw bench`, modelled, replayed in virtual time and judged (`plan --simulate`)."""
