"""Shared HTTP server for the engine stand-ins (stdlib only: they run under any python3)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def serve(
    host: str,
    port: int,
    *,
    name: str,
    model: str,
    metrics_path: str | None,
    metrics_text: str,
    api_key: str | None,
    guarded_prefixes: tuple[str, ...] = ("/v1",),
    warmup_s: float = 0.0,
    warmup_headers: dict[str, str] | None = None,
    adapters: dict[str, str] | None = None,
    runtime_lora: bool = False,
    on_request: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """`adapters` (name -> path, vLLM's --lora-modules; None without --enable-lora): served under their names
    beside `model`, a request naming any other model is a 404 as vLLM answers it; `runtime_lora` (the
    VLLM_ALLOW_RUNTIME_LORA_UPDATING environment) mounts /v1/load_lora_adapter and /v1/unload_lora_adapter.
    Every POST is kept, and GET /standin/calls lists them (path and body) for a test to compare."""
    started = time.monotonic()
    calls: list[list[object]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            sys.stdout.write(f"{name}: {format % args}\n")
            sys.stdout.flush()

        def _send(
            self, status: int, body: str, ctype: str = "application/json", extra: dict[str, str] | None = None
        ) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            warming = time.monotonic() - started < warmup_s
            if self.path == "/health":
                if warming:
                    self._send(503, "", extra=warmup_headers)
                else:
                    self._send(200, "")
                return
            if metrics_path and self.path == metrics_path:
                self._send(200, metrics_text, "text/plain; version=0.0.4")
                return
            guarded = self.path.startswith(guarded_prefixes) and api_key
            if guarded and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(
                    401, json.dumps({"error": {"message": "Unauthorized", "type": "invalid_request_error"}})
                )
                return
            if self.path == "/standin/calls":
                self._send(200, json.dumps(calls))
                return
            if self.path == "/v1/models":
                cards = [{"id": model, "object": "model", "owned_by": name}]
                cards += [
                    {"id": a, "object": "model", "parent": model, "root": p}
                    for a, p in (adapters or {}).items()
                ]
                self._send(200, json.dumps({"object": "list", "data": cards}))
                return
            self._send(404, json.dumps({"error": {"message": "not found"}}))

        def do_POST(self) -> None:
            # As vLLM does: the key guards only the API prefixes, so `/invocations` (SageMaker's entry point,
            # a full completion), `/pooling` and `/score` answer anyone who can reach the port.
            length = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(length) or b"{}")
            calls.append([self.path, request])
            guarded = self.path.startswith(guarded_prefixes) and api_key
            if guarded and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._send(
                    401, json.dumps({"error": {"message": "Unauthorized", "type": "invalid_request_error"}})
                )
                return
            if runtime_lora and adapters is not None and self.path == "/v1/load_lora_adapter":
                lora = str(request.get("lora_name"))
                if lora in adapters:
                    self._send(
                        400,
                        json.dumps(
                            {"error": {"message": f"The lora adapter '{lora}' has already been loaded."}}
                        ),
                    )
                    return
                adapters[lora] = str(request.get("lora_path"))
                # vLLM answers its success in plain text, not JSON
                self._send(200, f"Success: LoRA adapter '{lora}' added successfully.", "text/plain")
                return
            if runtime_lora and adapters is not None and self.path == "/v1/unload_lora_adapter":
                lora = str(request.get("lora_name"))
                if adapters.pop(lora, None) is None:
                    message = f"The lora adapter '{lora}' cannot be found."
                    self._send(404, json.dumps({"error": {"message": message, "type": "NotFoundError"}}))
                    return
                self._send(200, f"Success: LoRA adapter '{lora}' removed successfully.", "text/plain")
                return
            if adapters is not None and request.get("model") not in (model, *adapters):
                self._send(
                    404,
                    json.dumps({"error": {"message": f"The model `{request.get('model')}` does not exist."}}),
                )
                return
            if self.path not in (
                "/v1/completions",
                "/v1/chat/completions",
                "/invocations",
                "/pooling",
                "/score",
            ):
                self._send(404, json.dumps({"error": {"message": "not found"}}))
                return
            if on_request is not None:
                on_request(request)
            words = [f"w{i}" for i in range(int(request.get("max_tokens") or 4))]
            if not request.get("stream"):
                body = {"object": "text_completion", "model": model, "choices": [{"text": " ".join(words)}]}
                self._send(200, json.dumps(body))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for word in [*words, None]:
                data = "[DONE]" if word is None else json.dumps({"choices": [{"text": word}]})
                event = f"data: {data}\n\n".encode()
                self.wfile.write(event)  # HTTP/1.0: the body ends when the connection closes
                self.wfile.flush()

    server = ThreadingHTTPServer((host, port), Handler)
    print(f"{name}: serving {model} on http://{host}:{port} (pid {os.getpid()})", flush=True)
    server.serve_forever()
