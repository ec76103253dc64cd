"""What the controller shows of the fleet, derived from the records: never stored, never acted on."""
