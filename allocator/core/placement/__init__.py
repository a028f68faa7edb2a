"""Placement of GPU pods at admission: the pure lifecycle (lifecycle.py) and what it is shown (view.py)."""
