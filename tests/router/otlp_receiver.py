"""An OTLP/HTTP trace collector on loopback for tests: POST /v1/traces with a protobuf
ExportTraceServiceRequest body (what the SDK's OTLP/HTTP exporter sends), decoded into plain spans."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from support import free_port


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent: str  # "" for a root
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class Receiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def names(self) -> set[str]:
        return {s.name for s in self.spans}

    async def export(self, request: web.Request) -> web.Response:
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415, text=f"expected protobuf, got {request.content_type}")
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for rs in message.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {a.key: _value(a.value) for a in s.attributes}
                    self.spans.append(
                        ReceivedSpan(
                            str(resource.get("service.name")),
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            attrs,
                        )
                    )
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self.export)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        self.port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
