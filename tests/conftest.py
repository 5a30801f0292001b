"""Test configuration: service fixtures are plugins, one module per service."""

pytest_plugins = [
    "tests.services.kafka",
    "tests.services.postgres",
    "tests.services.s3",
    "tests.services.spark",
]
