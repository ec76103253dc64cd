"""What is kept, in the store or on files: keys, usage, traffic, measured capacity, the weights mirror."""
