"""Octavo's own model implementations, their registry and weight loading."""
