"""Converters of activation functions and elementwise math beyond elementwise.py's tables."""
