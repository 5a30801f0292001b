"""The Dockerfile keeps its promises (issue 11.8). No Docker engine here: the file is
parsed and every promise checked against the build context and the command line."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def only(name: str) -> str:
    values = [rest for word, rest in instructions() if word == name]
    assert len(values) == 1, f"expected one {name}, found {values}"
    return values[0]


def exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), text
    return value


def test_base_image_and_dependencies_are_pinned() -> None:
    """The base image has a full version tag; pip installs against exact pins."""
    base = only("FROM")
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base), base
    runs = [rest for word, rest in instructions() if word == "RUN" and "pip install" in rest]
    assert len(runs) == 1 and "-c docker/constraints.txt" in runs[0]
    pins = [line for line in (ROOT / "docker" / "constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[a-z0-9-]+==[\w.]+", pin) for pin in pins), pins
    pinned = {pin.split("==")[0] for pin in pins}
    assert {"pyarrow", "numpy", "structlog", "boto3", "confluent-kafka", "psycopg"} <= pinned


def test_every_copy_source_exists_in_the_build_context() -> None:
    """COPY sources are there (config/ included); the config lands where CMD reads it."""
    copies = [rest for word, rest in instructions() if word == "COPY"]
    sources = [s for rest in copies for s in shlex.split(rest)[:-1]]
    for source in sources:
        assert (ROOT / source).exists(), source
    assert "config" in sources and "docker/constraints.txt" in sources
    config_dest = next(shlex.split(r)[-1] for r in copies if shlex.split(r)[0] == "config")
    cmd = exec_form(only("CMD"))
    config_arg = cmd[cmd.index("--config") + 1]
    assert config_arg.startswith(config_dest.rstrip("/") + "/")
    assert (ROOT / "config" / Path(config_arg).name).is_file()


def test_runs_the_sidecar_as_a_non_root_user_with_its_folders() -> None:
    """USER is not root; the entry point is cdc-agent; CMD is a sidecar whose socket
    folder and log folder the user's RUN step creates and owns; the log is a VOLUME."""
    user = only("USER")
    assert user not in ("root", "0") and not user.startswith("0:")
    assert exec_form(only("ENTRYPOINT")) == ["cdc-agent"]
    cmd = exec_form(only("CMD"))
    assert cmd[0] == "sidecar"
    socket = cmd[cmd.index("--socket") + 1]
    setup = next(rest for word, rest in instructions()
                 if word == "RUN" and "useradd" in rest)
    assert "useradd" in setup and re.search(rf"\b{re.escape(user)}\b", setup)
    socket_dir = str(Path(socket).parent)
    assert f"chown -R {user}:{user}" in setup and socket_dir in setup
    volumes = exec_form(only("VOLUME"))
    assert "/var/lib/cdc-agent" in volumes and socket_dir in volumes

    from agent._config import load_config

    config = load_config(ROOT / "config" / Path(cmd[cmd.index("--config") + 1]).name,
                         environ={})
    log_path = config.sink["uri"].removeprefix("file://")
    assert log_path.startswith("/var/lib/cdc-agent/") and log_path in setup


def test_cmd_and_healthcheck_are_real_commands() -> None:
    """The CMD and the HEALTHCHECK parse with cdc-agent's own parser, and the health
    probe asks the socket the sidecar listens on."""
    from agent.cli import build_parser

    parser = build_parser()
    cmd = exec_form(only("CMD"))
    assert parser.parse_args(cmd).command == "sidecar"
    health = only("HEALTHCHECK")
    options, _, probe = health.partition("CMD ")
    assert re.search(r"--interval=\d+s", options) and re.search(r"--timeout=\d+s", options)
    argv = exec_form(probe)
    assert argv[0] == "cdc-agent"
    try:
        parsed = parser.parse_args(argv[1:])
    except SystemExit as exc:  # pragma: no cover - shown when the subcommand is missing
        pytest.fail(f"HEALTHCHECK runs {argv}, which cdc-agent does not accept ({exc})")
    assert parsed.command == "health"
    assert argv[argv.index("--socket") + 1] == cmd[cmd.index("--socket") + 1]


def test_the_readme_documents_the_container() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docker run" in readme and "sidecar" in readme


def test_the_image_builds_the_c_sequencer() -> None:
    """setup.py (the extension's build) is in the context, gcc is there for the pip
    step, and the build fails unless ``sequencer._native`` imports."""
    copies = [s for word, rest in instructions() if word == "COPY" for s in shlex.split(rest)]
    assert "setup.py" in copies
    install = next(rest for word, rest in instructions() if word == "RUN" and "pip install" in rest)
    assert install.index("apt-get install") < install.index("gcc") < install.index("pip install")
    assert install.index("pip install") < install.index('python -c "import sequencer._native"')
