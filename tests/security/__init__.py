"""Tests that each guard one trust boundary; each is named after the finding in the security review it covers."""
