"""Helpers shared by several evidence kinds (public, so no probe reaches into another's privates)."""
