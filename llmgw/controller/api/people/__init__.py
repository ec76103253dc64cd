"""What people may do through the admin API: who is calling (`access`) and the API keys they make (`keys`)."""
