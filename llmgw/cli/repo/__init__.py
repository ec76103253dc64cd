"""The cluster repo's commands: validate, plan and apply (with --wait and --simulate), schemas, guard test."""
