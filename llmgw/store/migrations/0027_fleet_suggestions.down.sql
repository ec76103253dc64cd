-- Undoes 0027 (`llmgw upgrade --control-plane --rollback` past it): the posted suggestions are reports a
-- later `plan --suggest --post` makes again.
DROP TABLE IF EXISTS fleet_suggestions;
