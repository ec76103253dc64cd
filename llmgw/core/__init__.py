"""The pure floor: values in, values out; a clock and an rng are parameters.

Nothing here imports I/O (asyncio, aiohttp, sqlite3, psycopg, git, asyncssh, subprocess, socket,
prometheus_client) or any floor above it; pyproject's import-linter contracts hold that."""
