"""What serving should achieve and what it costs: a model's service objectives (`slo_spec`) and the Cluster's
prices per GPU class and CPU node kind (`cost_spec`), read by `llmgw plan` and `llmgw plan --suggest`."""
