"""`llmgw plan --suggest`: the cheapest fleet the repo allows that meets its models' service objectives.

Pure: demand from a trace (`demand`), a fast estimate of what a pool of replicas does with it (`evaluate`), the
configurations the repo allows with what each costs and holds (`space`), the search over them (`search`), the
report (`render`) and the edit of the repo's YAML that makes the suggestion a commit (`yaml_edit`). The replay
that confirms the best candidates runs the router's own decisions, so it lives in the CLI
(llmgw/cli/repo/plan_suggest.py). docs/gitops.md, Suggested fleets, says what is searched and what is not.
"""
