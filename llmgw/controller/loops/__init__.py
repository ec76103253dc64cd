"""What runs on its own, pass after pass, and acts on the fleet: reconcile, nodes, canaries, checks."""
