"""What the Controller holds: its records, settings and credentials, and its collaborators (hub, lease)."""
