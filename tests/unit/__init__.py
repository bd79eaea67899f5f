"""Unit tests: the pure settlement core, no I/O."""
