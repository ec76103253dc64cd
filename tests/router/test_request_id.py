"""The router's own request ids: UUIDv7s in hex (RFC 9562), as usage ids are: distinct, and in the order they
were made to the millisecond, so the usage rows' request_id index grows at its end."""

import time
import uuid

from llmgw_router.path.lookup import new_request_id


def test_request_ids_are_uuid7_hex_distinct_and_ordered_by_time() -> None:
    before_ms = time.time_ns() // 1_000_000
    ids = [new_request_id() for _ in range(2000)]
    after_ms = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for rid in ids:
        parsed = uuid.UUID(hex=rid)
        assert parsed.hex == rid and parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert before_ms <= int(rid[:12], 16) <= after_ms  # the first 48 bits: milliseconds since the epoch
    # Made one after another: never earlier than the last one's millisecond.
    stamps = [int(rid[:12], 16) for rid in ids]
    assert stamps == sorted(stamps)
