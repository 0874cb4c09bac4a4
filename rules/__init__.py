"""The built-in rule pack (YAML files by area, each rule's test cases beside it)."""
