"""Whole-repo checks: semantic.check and the per-kind checks it calls."""
