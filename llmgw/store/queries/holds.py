"""What an operator holds nodes and facilities with: node drains (`llmgw node drain`: cordoned until
released) and facility holds (`llmgw facility hold rack=r1`: nothing new placed there), kept across a
controller restart or a fail-over. Mixed into `Store`."""

from __future__ import annotations

from llmgw.store.db import Backend
from llmgw.store.records import FacilityHold

__all__ = ["HoldQueries"]


class HoldQueries:
    db: Backend

    async def set_node_drain(self, node: str, words: str, now: float) -> None:
        """Record that `node` is drained (cordoned until `clear_node_drain`), in `words`."""
        async with self.db.tx() as tx:
            await tx.execute(
                "INSERT INTO node_drains (node, words, at) VALUES (?, ?, ?) "
                "ON CONFLICT (node) DO UPDATE SET words = excluded.words, at = excluded.at",
                (node, words, now),
            )

    async def clear_node_drain(self, node: str) -> bool:
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM node_drains WHERE node = ?", (node,)) > 0

    async def list_node_drains(self) -> dict[str, str]:
        """Drained node -> the words recorded with its drain."""
        async with self.db.tx() as tx:
            rows = await tx.fetch("SELECT node, words FROM node_drains ORDER BY node")
        return {str(r[0]): str(r[1]) for r in rows}

    async def set_facility_hold(self, domain: str, hold: FacilityHold, now: float) -> None:
        """Record that facility `domain` (`rack=r1`) is held until `clear_facility_hold`."""
        async with self.db.tx() as tx:
            await tx.execute(
                "INSERT INTO facility_holds (domain, words, drain, at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (domain) DO UPDATE SET words = excluded.words, drain = excluded.drain, "
                "at = excluded.at",
                (domain, hold.words, int(hold.drain), now),
            )

    async def clear_facility_hold(self, domain: str) -> bool:
        async with self.db.tx() as tx:
            return await tx.execute("DELETE FROM facility_holds WHERE domain = ?", (domain,)) > 0

    async def list_facility_holds(self) -> dict[str, FacilityHold]:
        """Held domain -> its hold."""
        async with self.db.tx() as tx:
            rows = await tx.fetch("SELECT domain, words, drain FROM facility_holds ORDER BY domain")
        return {str(r[0]): FacilityHold(str(r[1]), bool(r[2])) for r in rows}
