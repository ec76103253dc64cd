"""What the controller says to the outside: the admin API's shapes, its OpenAPI, log pages, webhooks."""
