"""Where a request goes: the shells (fallback chain, admission queue, prefix keys) around the decisions."""
