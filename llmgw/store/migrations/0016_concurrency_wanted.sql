-- When a holder last asked a concurrency limit for more slots than its pool had free (issue 37). Holders that
-- keep idle slots for a short linger read it and give them back at once when someone asked since they last
-- looked: a slot another router process waits for is not kept idle. NULL: nobody ever came up short.
-- Numbered 0016 on the `slots` branch; renumber at merge if another migration took it.
ALTER TABLE concurrency_pools ADD COLUMN wanted_at DOUBLE PRECISION;
