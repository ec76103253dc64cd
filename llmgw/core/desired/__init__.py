"""What the cluster repo declares: the validation pipeline, the Catalog it builds, the binding report."""
