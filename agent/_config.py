"""Configuration files: one TOML file per deployment shape (examples in ``config/``).

    [agent]                 Agent options: max_quiescence_interval, quiescence_wait_timeout,
                            max_queue
    [sink]                  kind = "memory" | "wal3" | "kafka"; the other keys are the
                            sink's own options (wal3: uri, endpoint_url; kafka: KafkaSink's
                            keyword arguments, with [sink.config] for librdkafka)
    [store]                 kind = "memory" | "postgres"; postgres: dsn, and one
                            [store.tables.<name>] per table: key_column, columns,
                            presence_column (optional)
    [consumer]              free-form, read by the consumers (``cdc-agent tail``)

Every problem is a ``ConfigError`` naming the file and the key.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinks import MemorySink, Sink

__all__ = ["Config", "ConfigError", "load_config"]

_AGENT_KEYS = {"max_quiescence_interval": (int, float), "quiescence_wait_timeout": (int, float),
               "max_queue": (int,)}
_SECTIONS = {"agent", "sink", "store", "consumer"}


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file and key."""


@dataclass
class Config:
    """A loaded configuration file."""

    path: Path
    agent: dict[str, Any] = field(default_factory=dict)
    sink: dict[str, Any] = field(default_factory=lambda: {"kind": "memory"})
    store: dict[str, Any] = field(default_factory=lambda: {"kind": "memory"})
    consumer: dict[str, Any] = field(default_factory=dict)

    def open_sink(self) -> Sink:
        """Build the configured sink (its driver is imported only now)."""
        options = dict(self.sink)
        kind = options.pop("kind")
        try:
            if kind == "memory":
                _no_options(self, "sink", options)
                return MemorySink()
            if kind == "wal3":
                from sinks.wal3 import open_log_sink

                uri = options.pop("uri", None)
                if not isinstance(uri, str):
                    raise ConfigError(f"{self.path}: [sink] kind = \"wal3\" needs uri = "
                                      "\"file:///dir\" or \"s3://bucket/prefix\"")
                return open_log_sink(uri, **options)
            if kind == "kafka":
                from sinks.kafka import KafkaSink  # type: ignore[import-not-found,unused-ignore]

                sink: Sink = KafkaSink(**options)
                return sink
        except TypeError as exc:  # an option the sink does not take
            raise ConfigError(f"{self.path}: [sink] kind = {kind!r}: {exc}") from exc
        raise ConfigError(f"{self.path}: [sink] kind = {kind!r} is not one of "
                          "\"memory\", \"wal3\", \"kafka\"")

    def open_store(self) -> Any:
        """Build the configured relaxed store."""
        options = dict(self.store)
        kind = options.pop("kind")
        if kind == "memory":
            from agent._store import MemoryStore

            _no_options(self, "store", options)
            return MemoryStore()
        if kind == "postgres":
            from agent._postgres_spec import TableSpec
            from agent._postgres_store import PostgresStore

            dsn = options.pop("dsn", None)
            tables = options.pop("tables", None)
            if not isinstance(dsn, str) or not isinstance(tables, dict) or not tables:
                raise ConfigError(f"{self.path}: [store] kind = \"postgres\" needs dsn and "
                                  "at least one [store.tables.<name>] section")
            try:
                specs = {name: TableSpec(**spec) for name, spec in tables.items()}
                return PostgresStore(dsn, specs, **options)
            except TypeError as exc:
                raise ConfigError(f"{self.path}: [store]: {exc}") from exc
        raise ConfigError(f"{self.path}: [store] kind = {kind!r} is not one of "
                          "\"memory\", \"postgres\"")


def _no_options(config: Config, section: str, options: dict[str, Any]) -> None:
    if options:
        raise ConfigError(f"{config.path}: [{section}] takes no other keys, got "
                          f"{sorted(options)}")


def load_config(path: str | Path) -> Config:
    """Read and check a configuration file."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    unknown = set(raw) - _SECTIONS
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {sorted(unknown)}; "
                          f"known: {sorted(_SECTIONS)}")
    config = Config(path)
    agent = raw.get("agent", {})
    for key, value in agent.items():
        if key not in _AGENT_KEYS:
            raise ConfigError(f"{path}: [agent] {key} is not an agent option; "
                              f"known: {sorted(_AGENT_KEYS)}")
        if type(value) not in _AGENT_KEYS[key]:
            raise ConfigError(f"{path}: [agent] {key} = {value!r} should be a number")
        if value <= 0:
            raise ConfigError(f"{path}: [agent] {key} = {value!r} must be positive")
    config.agent = dict(agent)
    for section in ("sink", "store"):
        if section in raw:
            if "kind" not in raw[section]:
                raise ConfigError(f"{path}: [{section}] needs kind = \"...\"")
            setattr(config, section, dict(raw[section]))
    config.consumer = dict(raw.get("consumer", {}))
    return config
