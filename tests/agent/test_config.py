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


def test_memory_config_gives_memory_store_and_sink(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[store]\nkind = 'memory'\n[sink]\nkind = 'memory'\n"))
    assert isinstance(config.open_store(), MemoryStore)
    assert isinstance(config.open_sink(), MemorySink)
