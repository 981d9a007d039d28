"""Who may reach a node: certificates (dpeer certs), the auth policy, exposure checks; pure except certs."""
