"""Session fixture for the postgres service (see the module docstring once written)."""
