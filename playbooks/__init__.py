"""One playbook per cause id: what it means, how to confirm it, how to fix it."""
