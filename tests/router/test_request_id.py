"""The router's own request ids: random UUID4s in hex, as uuid.uuid4().hex would give."""

import uuid

from llmgw_router.path.lookup import new_request_id


def test_request_ids_are_uuid4_hex_and_distinct() -> None:
    ids = [new_request_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for rid in ids:
        parsed = uuid.UUID(hex=rid)
        assert parsed.hex == rid and parsed.version == 4 and parsed.variant == uuid.RFC_4122
