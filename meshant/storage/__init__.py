"""Storage: the queen's journal."""
