-- The leader lease's epoch (issue 39, fencing): raised by one each time the lease changes hands, kept while the
-- same holder renews. A leader's writes that only a leader may make (replicas placed, dropped) carry the epoch
-- and holder it won with; the store refuses them once someone else holds the lease, so a controller deposed by a
-- partition cannot act after the partition heals. 0 for a row from before it.
-- Numbered 0018 on the `hosts` branch, after the continuity branch's 0017; renumber at merge if taken.
ALTER TABLE leases ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
