"""A disaggregated model's request served in two steps (two_steps.py): a room of its own, beside the path."""
