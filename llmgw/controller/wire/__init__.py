"""What the controller tells routers (the snapshot stream) and engines (HTTP, install orders)."""
