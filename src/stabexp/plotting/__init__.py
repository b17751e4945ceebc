"""Collect run folders into tidy tables (collect.py) and draw figures from them (figures.py)."""
