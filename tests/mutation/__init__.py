"""Mutation testing of the security-critical checks (docs/testing.md "Mutation testing")."""
