"""The sidecar: the capture core as a process of its own, next to a legacy store.

Applications in any language write their store themselves and report each write over
a Unix socket (a JSON-lines protocol, ``docs/sidecar.md``); the sidecar sequences the
events and ships them, as an in-process ``Agent`` would. Start with ``_protocol.py``
(the messages and the value encoding, sans-IO), then ``_server.py``; ``_client.py`` is
the Python client with the ``Agent`` API.
"""

from agent.sidecar._client import SidecarClient, SidecarError, SidecarUnavailable
from agent.sidecar._protocol import PROTOCOL_VERSION, ProtocolError
from agent.sidecar._server import Sidecar, SidecarAddressInUse, SidecarSocketError

__all__ = [
    "PROTOCOL_VERSION",
    "ProtocolError",
    "Sidecar",
    "SidecarAddressInUse",
    "SidecarClient",
    "SidecarError",
    "SidecarSocketError",
    "SidecarUnavailable",
]
