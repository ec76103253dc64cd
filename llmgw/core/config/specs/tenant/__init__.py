"""What a tenant (Organization, Team, Project, Person) declares: people, capacity, retention, the response cache."""
