"""liveput."""
