"""Facilities: where nodes stand (site, room, row, rack, PDU) and what each place may draw.

A node says where it is with labels (`llmgw.io/rack: r12`, ...); the Cluster's `spec.facilities` caps the power
of a place, and a profile's `keep_within` keeps a multi-node replica inside one. Apart from
llmgw.core.config.models so that file stays one concept per screen; models re-exports each name.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from llmgw.core.config.base import Strict

FacilityLevel = Literal["site", "room", "row", "rack", "pdu"]
FACILITY_LEVELS: tuple[FacilityLevel, ...] = ("site", "room", "row", "rack", "pdu")
FACILITY_LABEL_PREFIX = "llmgw.io/"

# `rack=r12`: a level and the value nodes carry in that level's label.
DomainRef = Annotated[
    str,
    Field(
        pattern=r"^(site|room|row|rack|pdu)=[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$",
        description="A facility domain: a level (site, room, row, rack, pdu), `=`, and the value nodes carry "
        "in its label (`llmgw.io/rack: r12` is in `rack=r12`)",
    ),
]


class FacilitySettings(Strict):
    """What the places nodes stand in may draw (a model's replicas are spread across racks, then PDUs,
    whatever this says: docs/placement.md, Facilities)."""

    power_caps: dict[DomainRef, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict,
        description="Watts a domain may draw (e.g. {pdu=pdu-a1: 17000}): a shard whose GPUs would take its "
        "domain past the cap is not placed there. A node's draw is the larger of what its agent measures and "
        "its declared `power_watts` plus its busy GPUs times their class's `watts`",
    )
