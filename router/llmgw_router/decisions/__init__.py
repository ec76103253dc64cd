"""Pure: values in, values out; a clock and an rng are parameters. Held pure by a contract."""
