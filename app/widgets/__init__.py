"""Panels and charts of the main window (each lays out and wires; none runs long work)."""
