"""The stable public surface: names other code imports must stay."""

from __future__ import annotations

import agent
import replay
import sequencer
import sinks


def test_stable_names_are_exported() -> None:
    """The names promised in the README and issues exist and are sorted in __all__."""
    promised = {
        agent: {"ABSENT", "Agent", "MemoryStore", "AsyncAgent", "InvalidWrite"},
        sequencer: {"ChangeEvent", "EpochRecord", "MonotonicIds"},
        sinks: {"MemorySink", "Setsum", "Sink", "EventBatch"},
        replay: {"Assembler", "InconsistentLog", "Position", "Frontier", "Changeset"},
    }
    for module, names in promised.items():
        assert names <= set(module.__all__), module.__name__
        assert list(module.__all__) == sorted(module.__all__), module.__name__
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
