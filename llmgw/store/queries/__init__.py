"""The store's queries by subject, each a mixin of `Store`."""
