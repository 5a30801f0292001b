"""Session fixture for the s3 service (see the module docstring once written)."""
