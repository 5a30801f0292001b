"""Configuration files: the shipped examples load; bad files fail naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import Agent, ConfigError, MemoryStore, load_config
from sinks import MemorySink

CONFIG_DIR = Path(__file__).parents[2] / "config"


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_example_loads(path: Path) -> None:
    """Each file in config/ parses and names a known sink and store kind."""
    config = load_config(path)
    assert config.sink["kind"] in {"memory", "wal3", "kafka"}
    assert config.store["kind"] in {"memory", "postgres"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("[agnet]\n", "unknown section"),
    ("[agent]\nmax_queue = 'many'\n", "max_queue = 'many' should be a number"),
    ("[agent]\nmax_quiescence_interval = -1\n", "must be positive"),
    ("[agent]\nspeed = 1\n", "speed is not an agent option"),
    ("[sink]\nuri = 'file:///x'\n", r"\[sink\] needs kind"),
    ("not toml = = =", "not valid TOML"),
])
def test_bad_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_config(write(tmp_path, text))
    assert "agent.toml" in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(tmp_path / "nope.toml")


def test_unknown_sink_kind_and_unknown_sink_option(tmp_path: Path) -> None:
    """An unknown kind lists the kinds; an option the sink does not take is named."""
    with pytest.raises(ConfigError, match='not one of "memory", "wal3", "kafka"'):
        load_config(write(tmp_path, "[sink]\nkind = 'tape'\n")).open_sink()
    config = load_config(write(tmp_path, f"[sink]\nkind = 'wal3'\nuri = 'file://{tmp_path}'\n"
                                         "colour = 'blue'\n"))
    with pytest.raises(ConfigError, match="colour"):
        config.open_sink()


def test_a_wal3_config_ships_a_replayable_log(tmp_path: Path) -> None:
    """The agent options and the wal3 sink of a file drive a real capture."""
    from replay import Assembler
    from sinks.wal3 import read_log

    log = tmp_path / "log"
    log.mkdir()
    config = load_config(write(tmp_path, f"[agent]\nmax_queue = 16\n"
                                         f"[sink]\nkind = 'wal3'\nuri = 'file://{log}'\n"))
    store = MemoryStore()
    agent = Agent(store, config.open_sink(), **config.agent)
    for i in range(50):
        agent.set("t", i % 7, "a", i)
    agent.close()
    state = list(Assembler().replay(read_log(f"file://{log}")))[-1].state
    assert state == store.snapshot()


def test_every_agent_option_reaches_the_agent(tmp_path: Path) -> None:
    """Each [agent] key the loader accepts is a keyword the Agent takes, from the file and
    from the environment (backpressure_timeout included)."""
    text = ("[agent]\nmax_queue = 16\nmax_quiescence_interval = 2.5\n"
            "quiescence_wait_timeout = 9\nbackpressure_timeout = 4\n[sink]\nkind = 'memory'\n")
    config = load_config(write(tmp_path, text),
                         environ={"CDC_AGENT_AGENT__BACKPRESSURE_TIMEOUT": "0.5"})
    assert config.agent["backpressure_timeout"] == 0.5
    agent = Agent(MemoryStore(), config.open_sink(), **config.agent)
    try:
        assert agent._backpressure_timeout == 0.5
    finally:
        agent.close()


def test_memory_config_gives_memory_store_and_sink(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[store]\nkind = 'memory'\n[sink]\nkind = 'memory'\n"))
    assert isinstance(config.open_store(), MemoryStore)
    assert isinstance(config.open_sink(), MemorySink)


# -- environment variables (issue 11.4) ---------------------------------------------------


def test_environment_overrides_the_file_typed_like_its_keys(tmp_path: Path) -> None:
    """CDC_AGENT_<SECTION>__<KEY> replaces the file's value, converted to the type the key
    has there (int stays int, float float, bool bool); [sink.config] keys take dots."""
    path = write(tmp_path, "[agent]\nmax_queue = 8\nmax_quiescence_interval = 2.5\n"
                           "[sink]\nkind = 'kafka'\nbootstrap = 'a:1'\ntopic = 't'\n"
                           "partitions = 3\n[sink.config]\n'linger.ms' = 5\n"
                           "'enable.idempotence' = false\n")
    config = load_config(path, environ={
        "CDC_AGENT_AGENT__MAX_QUEUE": "16", "CDC_AGENT_AGENT__MAX_QUIESCENCE_INTERVAL": "7",
        "CDC_AGENT_SINK__TOPIC": "2024", "CDC_AGENT_SINK__PARTITIONS": "6",
        "CDC_AGENT_SINK__CONFIG__LINGER_MS": "50",
        "CDC_AGENT_SINK__CONFIG__ENABLE_IDEMPOTENCE": "true",
        "PATH": "/bin", "CDC_AGENTX": "not ours",
    })
    assert config.agent == {"max_queue": 16, "max_quiescence_interval": 7.0}
    assert type(config.agent["max_quiescence_interval"]) is float
    assert config.sink["topic"] == "2024" and config.sink["partitions"] == 6
    assert config.sink["config"] == {"linger.ms": 50, "enable.idempotence": True}
    assert config.where("sink", "topic") == "environment variable CDC_AGENT_SINK__TOPIC"


def test_environment_alone_chooses_the_sink(tmp_path: Path) -> None:
    """Without a file, the variables build the whole configuration; a new key of no
    known type reads as a TOML value (6, true) or else as text."""
    config = load_config(None, environ={"CDC_AGENT_SINK__KIND": "wal3",
                                        "CDC_AGENT_SINK__URI": str(tmp_path / "log"),
                                        "CDC_AGENT_CONSUMER__COMMIT_EVERY": "10",
                                        "CDC_AGENT_CONSUMER__GROUP_ID": "g-1"})
    assert config.sink_given
    assert config.sink == {"kind": "wal3", "uri": (tmp_path / "log").as_uri()}
    assert config.consumer == {"commit_every": 10, "group_id": "g-1"}
    assert not load_config(None, environ={}).sink_given


@pytest.mark.parametrize(("name", "value", "message"), [
    ("CDC_AGENT_SINKK__URI", "x", "environment variable CDC_AGENT_SINKK__URI: not a "
                                  "configuration key"),
    ("CDC_AGENT_URI", "x", "environment variable CDC_AGENT_URI: not a configuration key"),
    ("CDC_AGENT_AGENT__SPEED", "1", "CDC_AGENT_AGENT__SPEED: speed is not an agent option"),
    ("CDC_AGENT_AGENT__MAX_QUEUE", "lots", "CDC_AGENT_AGENT__MAX_QUEUE='lots': expected int"),
    ("CDC_AGENT_AGENT__MAX_QUEUE", "-4", "environment variable CDC_AGENT_AGENT__MAX_QUEUE = "
                                         "-4 must be positive"),
])
def test_bad_environment_variables_are_named(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(None, environ={name: value})


def test_unknown_sink_option_from_the_environment_is_named(tmp_path: Path) -> None:
    """A key the sink does not take is caught before the sink is built, naming the
    variable that set it (or the file and key)."""
    path = write(tmp_path, f"[sink]\nkind = 'wal3'\nuri = '{tmp_path}/log'\n")
    config = load_config(path, environ={"CDC_AGENT_SINK__COLOUR": "blue"})
    with pytest.raises(ConfigError, match=r"environment variable CDC_AGENT_SINK__COLOUR is "
                                          r"not an option of \[sink\] kind = 'wal3'"):
        config.open_sink()
    assert not (tmp_path / "log").exists()  # refused before anything was created


def test_environment_is_ignored_when_told(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """os.environ applies by default; environ={} reads the file alone."""
    monkeypatch.setenv("CDC_AGENT_AGENT__MAX_QUEUE", "32")
    path = write(tmp_path, "[agent]\nmax_queue = 8\n")
    assert load_config(path).agent == {"max_queue": 32}
    assert load_config(path, environ={}).agent == {"max_queue": 8}


def test_plain_paths_are_file_uris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wal3 uri without a scheme is a folder: relative to the configuration file in
    the file, to the current folder in a variable; URIs stay as they are."""
    sub = tmp_path / "etc"
    sub.mkdir()
    path = sub / "agent.toml"
    path.write_text("[sink]\nkind = 'wal3'\nuri = 'logs/shop'\n")
    assert load_config(path, environ={}).sink["uri"] == (sub / "logs" / "shop").as_uri()
    monkeypatch.chdir(tmp_path)
    config = load_config(path, environ={"CDC_AGENT_SINK__URI": "here"})
    assert config.sink["uri"] == (tmp_path / "here").as_uri()
    config = load_config(path, environ={"CDC_AGENT_SINK__URI": "s3://b/p"})
    assert config.sink["uri"] == "s3://b/p"
    log = load_config(path, environ={"CDC_AGENT_SINK__URI": str(tmp_path / "log")})
    sink = log.open_sink()
    sink.close()
    assert (tmp_path / "log" / "manifest").is_dir()


def test_the_native_switch_is_not_a_configuration_key() -> None:
    """``CDC_AGENT_NATIVE=0`` (pure-Python sequencer, agent._native) is left alone."""
    config = load_config(None, environ={"CDC_AGENT_NATIVE": "0", "CDC_AGENT_AGENT__MAX_QUEUE": "7"})
    assert config.agent["max_queue"] == 7
