"""Shared widgets every feature folder may use: the plot kit, the number tables, display helpers."""
