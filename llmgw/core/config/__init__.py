"""The cluster repo's documents as values: models of every kind, their schemas, positions, validation stages and
whole-repo checks.

No face: import the module you mean (`llmgw.core.config.models`, `.errors`, `.semantic` ...). The pipeline that
runs these stages and builds the Catalog is `llmgw.core.desired.repo`, one floor up from the catalog it builds, and the
shell that reads a directory is `llmgw.adapters.repo_files`; so config -> catalog -> repo runs one way, with no
lazy import to dodge a cycle.
"""
