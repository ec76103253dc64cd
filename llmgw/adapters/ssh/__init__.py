"""Nodes joining the cluster: the cluster CA (`ca`), bootstrap over SSH (`bootstrap`), agent wheels (`wheels`)."""
