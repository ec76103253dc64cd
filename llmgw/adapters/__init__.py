"""The adapters floor: every outside system (repo files, git, SSH, secrets, keys over the store,
aiohttp helpers) behind one module, used by the apps above and using only the core and the store below."""
