"""A model's files: where each is fetched from, their manifest and headers, whether they fit a GPU."""
