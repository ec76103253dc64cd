"""Who may use what, and how much: tenants' limits and admission, projects, API key shapes."""
