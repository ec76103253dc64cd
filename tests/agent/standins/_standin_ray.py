"""The little wire the Ray stand-in speaks (tests/agent/standins/ray) and the vLLM stand-in asks.

A head keeps a TCP listener on its --port; a worker holds one connection open after `join IP GPUS`, so a
worker that dies leaves the cluster; `status` answers the nodes as JSON. Only the behaviour llmgw relies on is
imitated: nodes joining and leaving, and GPUs counted per node.
"""

import json
import socket


def ask_status(address: str, timeout: float = 2.0) -> list[dict]:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(b"status\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return json.loads(data.decode())
