"""Configuration: one TOML file per deployment shape (examples in ``config/``), and
environment variables that override it (docs/configuration.md).

    [agent]                 Agent options: max_quiescence_interval, quiescence_wait_timeout,
                            max_queue, backpressure_timeout
    [sink]                  kind = "memory" | "wal3" | "kafka"; the other keys are the
                            sink's own options (wal3: uri, endpoint_url; kafka: KafkaSink's
                            keyword arguments, with [sink.config] for librdkafka)
    [store]                 kind = "memory" | "postgres"; postgres: dsn, and one
                            [store.tables.<name>] per table: key_column, columns,
                            presence_column (optional)
    [consumer]              free-form, read by the consumers (``cdc-agent tail``)

``CDC_AGENT_<SECTION>__<KEY>`` (two underscores between the parts, e.g.
``CDC_AGENT_SINK__URI``, ``CDC_AGENT_AGENT__MAX_QUEUE``, ``CDC_AGENT_SINK__CONFIG__LINGER_MS``
for ``[sink.config] "linger.ms"``) sets or overrides one key; its text is read as the
type the key has in the file (or the option's declared type), and a variable under the
prefix that names no section or option is an error naming the variable. A wal3 ``uri``
may be a plain path (relative paths: from the configuration file's folder, or the
current one for a variable).

Every problem is a ``ConfigError`` naming the file and the key, or the variable.
"""

from __future__ import annotations

import inspect
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinks import MemorySink, Sink, redact

__all__ = ["ENV_PREFIX", "Config", "ConfigError", "load_config", "uri_from_path"]

ENV_PREFIX = "CDC_AGENT_"
_AGENT_KEYS = {"max_quiescence_interval": (int, float), "quiescence_wait_timeout": (int, float),
               "max_queue": (int,), "backpressure_timeout": (int, float)}
_SECTIONS = {"agent", "sink", "store", "consumer"}
_SINK_KINDS = '"memory", "wal3", "kafka"'
_SCHEMES = ("file://", "s3://", "memory://")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and key, or the
    environment variable, at fault."""


@dataclass
class Config:
    """A loaded configuration (file, then environment)."""

    path: Path | None
    agent: dict[str, Any] = field(default_factory=dict)
    sink: dict[str, Any] = field(default_factory=lambda: {"kind": "memory"})
    store: dict[str, Any] = field(default_factory=lambda: {"kind": "memory"})
    consumer: dict[str, Any] = field(default_factory=dict)
    # "section.key" -> the environment variable that set it (for error messages)
    from_env: dict[str, str] = field(default_factory=dict)
    # whether a file or a variable chose the sink (else the command's default applies)
    sink_given: bool = False

    def where(self, section: str, key: str | None = None) -> str:
        """Who set ``[section] key``: the variable's name, or the file and key."""
        if key is not None and f"{section}.{key}" in self.from_env:
            return f"environment variable {self.from_env[f'{section}.{key}']}"
        source = str(self.path) if self.path is not None else "configuration"
        return f"{source}: [{section}]" + (f" {key}" if key is not None else "")

    def describe_sink(self) -> str:
        """Where the sink ships, fit to print (credentials redacted)."""
        kind = self.sink.get("kind")
        if kind == "wal3":
            return redact(str(self.sink.get("uri")))
        if kind == "kafka":
            return redact(f"kafka://{self.sink.get('bootstrap')}/{self.sink.get('topic')}")
        return "memory:// (kept in this process only)"

    def open_sink(self) -> Sink:
        """Build the configured sink (its driver is imported only now)."""
        options = dict(self.sink)
        kind = options.pop("kind")
        if kind == "memory":
            self._check_options("sink", options, set())
            return MemorySink()
        if kind == "wal3":
            from sinks.wal3 import Wal3Sink, open_log_sink

            uri = options.pop("uri", None)
            if not isinstance(uri, str):
                raise ConfigError(f"{self.where('sink')} kind = \"wal3\" needs uri = "
                                  "\"file:///dir\" (or a path) or \"s3://bucket/prefix\"")
            self._check_options("sink", options, _parameters(Wal3Sink) | {"endpoint_url"})
            wal3: Sink = self._build("sink", kind, lambda: open_log_sink(uri, **options))
            return wal3
        if kind == "kafka":
            from sinks.kafka import KafkaSink  # type: ignore[import-not-found,unused-ignore]

            self._check_options("sink", options, _parameters(KafkaSink))
            sink: Sink = self._build("sink", kind, lambda: KafkaSink(**options))
            return sink
        raise ConfigError(f"{self.where('sink', 'kind')} = {kind!r} is not one of "
                          f"{_SINK_KINDS}")

    def open_store(self) -> Any:
        """Build the configured relaxed store."""
        options = dict(self.store)
        kind = options.pop("kind")
        if kind == "memory":
            from agent._store import MemoryStore

            self._check_options("store", options, set())
            return MemoryStore()
        if kind == "postgres":
            from agent._postgres_spec import TableSpec
            from agent._postgres_store import PostgresStore

            dsn = options.pop("dsn", None)
            tables = options.pop("tables", None)
            if not isinstance(dsn, str) or not isinstance(tables, dict) or not tables:
                raise ConfigError(f"{self.where('store')} kind = \"postgres\" needs dsn and "
                                  "at least one [store.tables.<name>] section")
            self._check_options("store", options, _parameters(PostgresStore))
            try:
                specs = {name: TableSpec(**spec) for name, spec in tables.items()}
            except TypeError as exc:
                raise ConfigError(f"{self.where('store')}: {exc}") from exc
            return self._build("store", kind, lambda: PostgresStore(dsn, specs, **options))
        raise ConfigError(f"{self.where('store', 'kind')} = {kind!r} is not one of "
                          "\"memory\", \"postgres\"")

    def _check_options(self, section: str, options: dict[str, Any], known: set[str]) -> None:
        """Every key must be an option of the chosen kind: one check for every command."""
        for key in sorted(options):
            if key not in known:
                kind = getattr(self, section)["kind"]
                listed = ", ".join(sorted(known)) or "none"
                raise ConfigError(f"{self.where(section, key)} is not an option of "
                                  f"[{section}] kind = {kind!r} (its options: {listed})")

    def _build(self, section: str, kind: str, build: Callable[[], Any]) -> Any:
        try:
            return build()
        except (TypeError, ValueError) as exc:  # a value the sink or store refuses
            raise ConfigError(redact(f"{self.where(section)} kind = {kind!r}: {exc}")) from exc


def _parameters(factory: Callable[..., Any]) -> set[str]:
    """The keyword options a sink or store constructor takes from a configuration."""
    skip = {"self", "store_or_uri", "options", "clock", "sleep", "client", "spec", "tables",
            "dsn", "connect"}
    return {name for name, p in inspect.signature(factory).parameters.items()
            if name not in skip and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def uri_from_path(value: str, base: Path | None = None) -> str:
    """``value`` itself if it is a URI, else the ``file://`` URI of the path it names
    (relative to ``base``, or the current folder)."""
    if value.startswith(_SCHEMES) or "://" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    return path.resolve().as_uri()


def load_config(path: str | Path | None = None, *,
                environ: Mapping[str, str] | None = None) -> Config:
    """Read and check a configuration file (none: only the environment), then apply the
    ``CDC_AGENT_*`` variables of ``environ`` (default ``os.environ``; pass ``{}`` to
    ignore the environment)."""
    raw: dict[str, Any] = {}
    if path is not None:
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
    file_sink_uri = isinstance(raw.get("sink"), dict) and "uri" in raw["sink"]
    _apply_environment(config, raw, os.environ if environ is None else environ)
    agent = raw.get("agent", {})
    for key, value in agent.items():
        if key not in _AGENT_KEYS:
            raise ConfigError(f"{config.where('agent', key)} is not an agent option; "
                              f"known: {sorted(_AGENT_KEYS)}")
        if type(value) not in _AGENT_KEYS[key]:
            raise ConfigError(f"{config.where('agent', key)} = {value!r} should be a number")
        if value <= 0:
            raise ConfigError(f"{config.where('agent', key)} = {value!r} must be positive")
    config.agent = dict(agent)
    for section in ("sink", "store"):
        if section in raw:
            if "kind" not in raw[section]:
                raise ConfigError(f"{config.where(section)} needs kind = \"...\" (or "
                                  f"{ENV_PREFIX}{section.upper()}__KIND)")
            setattr(config, section, dict(raw[section]))
    config.sink_given = "sink" in raw
    uri = config.sink.get("uri")
    if config.sink.get("kind") == "wal3" and isinstance(uri, str):
        base = path.parent if file_sink_uri and "sink.uri" not in config.from_env and \
            isinstance(path, Path) else None
        config.sink["uri"] = uri_from_path(uri, base)
    config.consumer = dict(raw.get("consumer", {}))
    return config


# CDC_AGENT_* variables that are process switches, not configuration keys.
_PROCESS_SWITCHES = frozenset({"CDC_AGENT_NATIVE"})  # agent._native: 0 = pure Python


def _apply_environment(config: Config, raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    """Merge every ``CDC_AGENT_SECTION__KEY[__SUBKEY]`` variable into ``raw``."""
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in _PROCESS_SWITCHES:
            continue
        parts = name[len(ENV_PREFIX):].lower().split("__")
        if len(parts) < 2 or not all(parts) or parts[0] not in _SECTIONS:
            raise ConfigError(
                f"environment variable {name}: not a configuration key; use "
                f"{ENV_PREFIX}<SECTION>__<KEY> with SECTION one of "
                f"{', '.join(s.upper() for s in sorted(_SECTIONS))} (docs/configuration.md)")
        section, *keys = parts
        if section == "agent" and (len(keys) != 1 or keys[0] not in _AGENT_KEYS):
            raise ConfigError(f"environment variable {name}: {'.'.join(keys)} is not an agent "
                              f"option; known: {sorted(_AGENT_KEYS)}")
        if section == "sink" and len(keys) == 2 and keys[0] == "config":
            keys = ["config", keys[1].replace("_", ".")]  # librdkafka keys use dots
        table = raw.setdefault(section, {})
        for key in keys[:-1]:
            table = table.setdefault(key, {})
            if not isinstance(table, dict):
                raise ConfigError(f"environment variable {name}: {key} is not a table")
        key = keys[-1]
        table[key] = _typed(name, environ[name], table.get(key), _declared_type(section, key))
        if len(keys) == 1:
            config.from_env[f"{section}.{key}"] = name


def _declared_type(section: str, key: str) -> type | None:
    if section == "agent":
        return float if key != "max_queue" else int
    return None


def _typed(name: str, text: str, current: Any, declared: type | None) -> Any:
    """``text`` as the type of the value it replaces (or the declared one); a new key of
    unknown type is read as a TOML value if it is one (``6``, ``true``, ``[..]``), else
    kept as a string."""
    # A declared type wins: "seconds = 9" in the file still takes "0.5" from the
    # environment.
    wanted = declared if declared is not None else type(current) if current is not None else None
    try:
        if wanted is bool:
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return lowered in ("true", "1", "yes")
        if wanted is int:
            return int(text)
        if wanted is float:
            return float(text)
        if wanted is str:
            return text
        value = tomllib.loads(f"value = {text}")["value"]
        if wanted is not None and not isinstance(value, wanted):
            raise ValueError
        return value
    except (ValueError, tomllib.TOMLDecodeError):
        if wanted is None:
            return text
        raise ConfigError(redact(f"environment variable {name}={text!r}: expected "
                                 f"{wanted.__name__ if wanted is not float else 'a number'}"
                                 f", like the key it sets")) from None
