"""The parts the kinds' models (config/models.py) are made of, one spec per module."""
