"""Test kits that ship with Octavo (the platform conformance suite)."""
