"""parcae."""
