"""Session fixture for the kafka service (see the module docstring once written)."""
