"""The MCP server (``mldoctor mcp``): mldoctor's diagnosis offered to coding agents as read-only
tools. A layer beside the TUI: it reads the report model and the renderers' scrubbing, and
imports the MCP SDK only inside ``server.build_server`` (``mldoctor --help`` never loads it)."""
