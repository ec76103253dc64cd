"""The admin API's route table: the one place its routes are registered from (`add_routes`), and what its OpenAPI
document is generated from (llmgw.core.api.openapi; committed as docs/admin-openapi.json, served at
/api/v1/openapi.json). Each route: its endpoint (method, path, query, body, answers, errors, the scope its
token needs) and its handler. Scopes: `plan` reads, `apply` applies revisions, `admin` does everything else
(llmgw.controller.parts.admin_tokens); `router`: a router's token or an admin one; `none`: the webhook, which
trusts nothing in its body.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from llmgw.controller.api import (
    admin,
    audited as admin_ops,
    capacity as capacity_admin,
    doctor,
    evals as admin_evals,
    fleet as admin_fleet,
    guard,
    logs as logs_admin,
    prom_sd,
    request_lookup as admin_requests,
    usage_summary as usage_summary_admin,
    weights as weights_admin,
)
from llmgw.controller.api.guard import Handler
from llmgw.controller.api.people import keys as keys_api
from llmgw.controller.parts.admin_tokens import Scope
from llmgw.core.api import admin_api as m
from llmgw.core.api.openapi import Auth, Endpoint, Query, document
from llmgw.core.api.suggestions import PostedSuggestion, SuggestionBody, SuggestionsAnswer
from llmgw.core.api.weight_updates import UpdateChecksAnswer
from llmgw.core.fleet.views import LiveState
from llmgw.core.traffic.usage_summary import UsageSummary
from llmgw.core.words import DURATION_OR_SECONDS_PATTERN, DURATION_PATTERN
from llmgw.store import USAGE_GROUPS
from llmgw.store.records import TAG_GROUP_PREFIX

__all__ = ["OPENAPI_PATH", "ROUTES", "Route", "add_routes", "openapi_document"]

OPENAPI_PATH = "/api/v1/openapi.json"
NOT_APPLIED = "No revision is applied yet"
NO_MODEL = "The model is not in the applied revision"
NO_NODE = "No such node has connected to this controller"
STORE_DOWN = "The store is unavailable"
DOMAIN = {
    "type": "string",
    "pattern": r"^(site|room|row|rack|pdu)=[^/]+$",
    "description": "LEVEL=VALUE, e.g. rack=r12",
}
BAD_BODY = "The body is not JSON of the shape the schema gives; the message says what is wrong"
SINCE = Query("since", {"type": "number"}, "Seconds since the epoch: only what came after")
LIMIT = Query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "At most this many")
LOG_QUERY = (
    Query(
        "since",
        {"type": "string", "pattern": DURATION_PATTERN},
        "A duration: the lines of the last 10m are since=10m",
    ),
    Query(
        "grep",
        {"type": "string", "maxLength": 500, "format": "regex"},
        "A regular expression the lines must match",
    ),
    Query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "Lines at most (default 200)"),
    Query(
        "cursor",
        {"type": "string", "pattern": "^[A-Za-z0-9_-]*$"},
        "next_cursor of the page before, as it came (opaque): the lines after it",
    ),
    Query("follow", {"type": "boolean"}, "Stream new lines as NDJSON until the client goes"),
)
USAGE_BY_PATTERN = f"^({'|'.join(USAGE_GROUPS)}|{TAG_GROUP_PREFIX}.+)$"
SCOPES: dict[Auth, Scope] = {"plan": "plan", "apply": "apply", "admin": "admin"}
LOGS_ERRORS = {400: "A query parameter is wrong", 404: "No such target", 503: "No node answered"}


@dataclass(frozen=True, slots=True)
class Route:
    endpoint: Endpoint
    handler: Handler
    # People may call it too, with their own key, within their role (guard.person_or_scoped; the handler asks
    # the roles table): the API keys.
    people: bool = False


def _r(
    method: str, path: str, auth: Auth, summary: str, handler: Handler, *, people: bool = False, **kw: Any
) -> Route:
    return Route(Endpoint(method, path, auth, summary, **kw), handler, people)


async def _openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


ROUTES: tuple[Route, ...] = (
    _r("GET", OPENAPI_PATH, "plan", "This document", _openapi, answers={200: m.OpenApiDocument}),
    _r(
        "GET",
        "/api/v1/status",
        "plan",
        "The revision in force, sync, models and nodes",
        admin.status,
        answers={200: m.StatusAnswer},
    ),
    _r("GET", "/api/v1/nodes", "plan", "Every node and its state", admin.nodes, answers={200: m.NodesAnswer}),
    _r(
        "GET",
        "/api/v1/replicas",
        "plan",
        "Every replica (the output tail for an admin-scope token only)",
        admin.replicas,
        answers={200: m.ReplicasAnswer},
        query=(Query("model", {"type": "string"}, "Only this model's replicas"),),
    ),
    # Engine output can carry what clients sent (prompts): the whole stream needs an admin-scope token.
    _r(
        "GET",
        "/api/v1/nodes/{node}/logs",
        "admin",
        "A node's log lines",
        logs_admin.node_logs,
        answers={200: m.LogsPage},
        errors=LOGS_ERRORS,
        streams="application/x-ndjson",
        query=(Query("source", {"type": "string"}, "Only this source (agent, or a replica id)"), *LOG_QUERY),
    ),
    _r(
        "GET",
        "/api/v1/replicas/{replica_id}/logs",
        "admin",
        "A replica's engine output",
        logs_admin.replica_logs,
        answers={200: m.LogsPage},
        errors=LOGS_ERRORS,
        streams="application/x-ndjson",
        query=LOG_QUERY,
    ),
    _r(
        "GET",
        "/api/v1/models",
        "plan",
        "Every model of the applied revision and its health",
        admin.models,
        answers={200: m.ModelsAnswer},
    ),
    _r(
        "GET",
        "/api/v1/explain/{model}",
        "plan",
        "Where the model would be placed, and why not elsewhere",
        admin.explain,
        answers={200: m.ExplainAnswer},
        errors={404: NO_MODEL},
    ),
    _r(
        "GET",
        "/api/v1/state",
        "plan",
        "The live state `llmgw plan` compares the repo against",
        admin.state,
        answers={200: LiveState},
    ),
    _r(
        "GET",
        "/api/v1/weights",
        "plan",
        "The weights each node holds",
        admin.weights_list,
        answers={200: m.WeightsAnswer},
    ),
    _r(
        "POST",
        "/api/v1/weights/collect",
        "apply",
        "Remove weights no declared model references",
        admin.weights_collect,
        body=m.WeightsCollectBody,
        body_optional=True,
        answers={200: m.WeightsCollected},
        errors={400: BAD_BODY, 404: NO_NODE, 409: NOT_APPLIED},
    ),
    _r(
        "GET",
        "/api/v1/weights/updates",
        "plan",
        "The controller's last check for new weights upstream (nothing is asked by this call)",
        weights_admin.update_checks,
        answers={200: UpdateChecksAnswer},
    ),
    _r(
        "GET",
        "/api/v1/events",
        "plan",
        "Recent events, newest first",
        admin.events,
        answers={200: m.EventsAnswer},
        query=(LIMIT,),
        errors={400: "limit is not a whole number"},
    ),
    _r(
        "POST",
        "/api/v1/apply",
        "apply",
        "Apply a revision: a directory's files, or the files sent",
        admin.apply,
        body=m.ApplyBody,
        answers={200: m.ApplyAnswer},
        errors={
            400: BAD_BODY,
            403: "This controller does not accept revisions over the admin API",
            409: "The revision label is a git commit these files are not",
            422: "The revision was refused: `errors` says why",
        },
    ),
    _r(
        "POST",
        "/api/v1/restart",
        "apply",
        "Replace a model's replicas (or one), make-before-break",
        admin_fleet.restart,
        body=m.RestartBody,
        answers={202: m.RestartAnswer},
        errors={400: BAD_BODY, 404: "Neither a model nor a replica", 409: NOT_APPLIED},
    ),
    _r(
        "POST",
        "/api/v1/evals/run",
        "apply",
        "Run an eval suite against a ready replica",
        admin_evals.eval_run,
        body=m.EvalRunBody,
        answers={200: m.EvalRunAnswer},
        errors={400: BAD_BODY, 404: "No such suite or model", 409: "No revision, or no ready replica"},
    ),
    _r(
        "POST",
        "/api/v1/models/{model}/check",
        "apply",
        "Probe the model's capabilities on one replica",
        admin_evals.model_check,
        body=m.ModelCheckBody,
        body_optional=True,
        answers={200: m.ModelCheckVerdict},
        errors={400: BAD_BODY, 404: NO_MODEL, 409: "No ready replica"},
    ),
    _r(
        "GET",
        "/api/v1/model-checks",
        "plan",
        "Every recorded model check verdict",
        admin_evals.model_checks,
        answers={200: m.ModelChecksAnswer},
    ),
    _r(
        "POST",
        "/api/v1/nodes/{node}/drain",
        "apply",
        "Cordon a node and move its replicas away",
        admin_fleet.drain,
        answers={202: m.DrainAnswer},
        errors={404: NO_NODE, 503: STORE_DOWN},
    ),
    _r(
        "POST",
        "/api/v1/nodes/{node}/uncordon",
        "apply",
        "Undo a drain",
        admin_fleet.uncordon,
        answers={200: m.UncordonAnswer},
        errors={404: NO_NODE, 503: STORE_DOWN},
    ),
    _r(
        "POST",
        "/api/v1/facility/holds/{domain}",
        "apply",
        "Hold a facility domain (LEVEL=VALUE): nothing new is placed on its nodes",
        admin_fleet.hold,
        path_schemas={"domain": DOMAIN},
        body=m.HoldBody,
        body_optional=True,
        answers={202: m.HoldAnswer},
        errors={400: BAD_BODY, 503: STORE_DOWN},
    ),
    _r(
        "POST",
        "/api/v1/facility/holds/{domain}/release",
        "apply",
        "Release a held facility domain",
        admin_fleet.release,
        path_schemas={"domain": DOMAIN},
        answers={200: m.ReleaseAnswer},
        errors={400: BAD_BODY, 503: STORE_DOWN},
    ),
    _r(
        "GET",
        "/api/v1/facility/holds",
        "plan",
        "Held facility domains",
        admin_fleet.holds,
        answers={200: m.HoldsAnswer},
    ),
    _r(
        "GET",
        "/api/v1/keys",
        "admin",
        "API keys",
        keys_api.keys_list,
        people=True,
        answers={200: m.KeysAnswer},
        query=(Query("project", {"type": "string"}, "Only this project's"),),
        errors={503: STORE_DOWN},
    ),
    _r(
        "POST",
        "/api/v1/keys",
        "admin",
        "A new API key, shown once",
        keys_api.keys_create,
        people=True,
        body=m.KeyCreateBody,
        answers={201: m.KeyCreated},
        errors={400: BAD_BODY, 404: "No such project in the applied revision", 503: STORE_DOWN},
    ),
    _r(
        "POST",
        "/api/v1/keys/{key_id}/revoke",
        "admin",
        "Revoke an API key",
        keys_api.keys_revoke,
        people=True,
        answers={200: m.KeyRevoked},
        errors={404: "No such key", 503: STORE_DOWN},
    ),
    _r(
        "GET",
        "/api/v1/audit",
        "plan",
        "The audit log, newest first",
        admin_ops.audit,
        answers={200: m.AuditAnswer},
        errors={400: "A query parameter is wrong", 503: STORE_DOWN},
        query=(SINCE, Query("actor", {"type": "string"}, "Only this token's entries"), LIMIT),
    ),
    # admin, not plan: usage and tags say who used what (a `user` tag is a person), and a plan token is one a
    # pull request's job holds.
    _r(
        "GET",
        "/api/v1/requests/{request_id}",
        "admin",
        "Every usage row of a request id",
        admin_requests.request_lookup,
        answers={200: m.RequestsAnswer},
        errors={404: "No usage row for that request", 503: STORE_DOWN},
    ),
    _r(
        "GET",
        "/api/v1/requests/{request_id}/body",
        "admin",
        "The request's kept bodies (a project's retention.bodies)",
        admin_requests.request_body,
        answers={200: m.KeptBodyAnswer},
        errors={
            404: "No body kept for it",
            409: "No content key",
            500: "The kept body cannot be opened",
            503: STORE_DOWN,
        },
    ),
    _r(
        "POST",
        "/api/v1/requests/{request_id}/replay",
        "admin",
        "The kept request sent to a ready replica of another model; both answers",
        admin_requests.request_replay,
        body=m.ReplayBody,
        answers={200: m.ReplayAnswer},
        errors={
            400: BAD_BODY,
            404: "No body kept, or no such model",
            409: "Not replayable now",
            500: "The kept body cannot be opened",
            503: STORE_DOWN,
        },
    ),
    _r(
        "GET",
        "/api/v1/usage",
        "admin",
        "Usage totals per group",
        admin_requests.usage_totals,
        answers={200: m.UsageAnswer},
        errors={400: "A query parameter is wrong", 503: STORE_DOWN},
        query=(
            Query(
                "by",
                {"type": "string", "default": "project", "pattern": USAGE_BY_PATTERN},
                "project, team, org, key, model, router, person or tag:KEY",
            ),
            SINCE,
        ),
    ),
    # plan, not admin: totals per project, model and tenant only (no key, tag or request), what a plan shows.
    _r(
        "GET",
        "/api/v1/usage/summary",
        "plan",
        "The usage summary `llmgw plan` joins its changes with",
        usage_summary_admin.usage_summary,
        answers={200: UsageSummary},
        errors={400: "window is not a duration up to 90d", 503: STORE_DOWN},
        query=(
            Query(
                "window",
                {"type": "string", "default": "7d", "pattern": DURATION_OR_SECONDS_PATTERN},
                "A duration, at most 90d",
            ),
        ),
    ),
    _r(
        "GET",
        "/api/v1/notifications",
        "plan",
        "Webhook deliveries waiting and dead",
        admin_ops.notifications,
        answers={200: m.DeliveriesAnswer},
        errors={400: "limit is not a whole number", 503: STORE_DOWN},
        query=(Query("dead", {"type": "boolean"}, "Only dead letters (true) or only waiting (false)"), LIMIT),
    ),
    _r(
        "GET",
        "/api/v1/prometheus/targets",
        "plan",
        "The fleet as Prometheus http_sd target groups",
        prom_sd.prometheus_targets,
        answers={200: m.TargetGroups},
    ),
    _r(
        "GET",
        "/api/v1/doctor",
        "plan",
        "The controller's health checks",
        doctor.controller_doctor,
        answers={200: m.DoctorAnswer},
    ),
    _r(
        "POST",
        "/api/v1/nodes/{node}/doctor",
        "plan",
        "A node's health checks",
        doctor.node_doctor,
        answers={200: m.DoctorAnswer},
    ),
    _r(
        "POST",
        "/api/v1/upgrade",
        "admin",
        "Roll a new agent version across the bootstrapped nodes",
        admin.upgrade,
        body=m.UpgradeBody,
        answers={200: m.UpgradeAnswer},
        errors={400: BAD_BODY, 409: "Not the leader, no revision, or an upgrade already running"},
    ),
    _r(
        "GET",
        "/api/v1/capacity",
        "plan",
        "Measured and assumed capacity per model and profile",
        capacity_admin.capacity_list,
        answers={200: m.CapacityAnswer},
    ),
    _r(
        "POST",
        "/api/v1/capacity",
        "admin",
        "Store a bench run's conclusion",
        capacity_admin.capacity_save,
        body=capacity_admin.BenchResult,
        answers={200: m.CapacitySaved},
        errors={400: BAD_BODY, 404: "No such model and profile in the applied revision"},
    ),
    _r(
        "POST",
        "/api/v1/suggestions",
        "plan",
        "Keep a fleet `llmgw plan --suggest --post` proposed, for the console's plan page",
        capacity_admin.suggestion_save,
        body=SuggestionBody,
        answers={200: PostedSuggestion},
        errors={400: BAD_BODY},
    ),
    _r(
        "GET",
        "/api/v1/suggestions",
        "plan",
        "The suggested fleets posted since this controller started, the newest per revision first",
        capacity_admin.suggestions_list,
        answers={200: SuggestionsAnswer},
    ),
    _r(
        "GET",
        "/api/v1/bench/{model}",
        "admin",
        "A ready replica of the model to measure",
        capacity_admin.bench_target,
        answers={200: m.BenchTarget},
        errors={404: "No such model or profile", 409: "No ready replica"},
        query=(Query("profile", {"type": "string"}, "Only this profile's replicas"),),
    ),
    # A router's token opens every engine key, a node's its hub session: the operators' scope, each issue
    # audited with the token's name.
    _r(
        "GET",
        "/api/v1/credentials/router",
        "admin",
        "The token routers present",
        admin.router_credential,
        answers={200: m.RouterCredential},
        errors={503: "The secret cannot be read"},
    ),
    _r(
        "GET",
        "/api/v1/credentials/node/{node}",
        "admin",
        "A node's token, for an agent installed by hand",
        admin.node_credential,
        answers={200: m.NodeCredential},
        errors={400: "Not a node name", 503: "The secret cannot be read"},
    ),
    # Where the store is (no password): what the CLI's store commands open when run elsewhere.
    _r(
        "GET",
        "/api/v1/store",
        "admin",
        "Where this controller's store is",
        admin_ops.store_location,
        answers={200: m.StoreLocation},
    ),
    _r(
        "POST",
        "/api/v1/webhook",
        "none",
        "Poll the repo now (a forge's push webhook)",
        admin.webhook,
        answers={202: m.PollAsked},
        errors={401: "The signature is missing or does not match"},
    ),
    _r(
        "POST",
        "/api/v1/demand/{model}",
        "router",
        "A router saw demand for a model at zero",
        admin.demand,
        answers={202: m.DemandNoted},
        errors={404: NO_MODEL},
    ),
    _r(
        "POST",
        "/api/v1/usage-seen",
        "router",
        "A router's models in use",
        admin.usage_seen,
        body=m.UsageSeenBody,
        answers={200: m.UsageSeenAnswer},
        errors={400: BAD_BODY},
    ),
)


@functools.cache
def openapi_document() -> m.JsonObject:
    """The admin API's OpenAPI document, from `ROUTES` (what docs/admin-openapi.json must equal)."""
    return document(r.endpoint for r in ROUTES)


def add_routes(app: web.Application) -> None:
    """Every admin route, from `ROUTES` only: each behind its scope check, and every change an admin token makes
    (and every credential it is handed) audited."""
    app.middlewares.append(guard.json_errors)
    for route in ROUTES:
        e = route.endpoint
        checked = route.handler
        scope = SCOPES.get(e.auth)
        if scope is not None:
            checked = (guard.person_or_scoped if route.people else guard.scoped)(scope, checked)
            if e.method != "GET" or e.path in admin_ops.AUDITED_READS:
                checked = admin_ops.audited(admin_ops.action_of(e.method, e.path), checked)
        app.router.add_route(e.method, e.path, checked)
