"""``mldoctor mcp``: the tools of ``tools.py`` served over stdio with the official MCP SDK.

The low-level ``Server`` is used rather than the decorator API because the tools already carry
hand-written JSON Schemas (the report's is the published ``report.schema.json``): the server
announces them as they are, and the client validates every structured result against them.

Failures come back as tool errors (``isError``) holding one line: bad input says what to fix,
a bug says "internal error" and its type, and no traceback ever reaches the agent (stderr gets
it only with MLDOCTOR_DEBUG=1). Tools run in a worker thread, so a long diagnosis does not stop
the server from answering pings.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from doctor import __version__
from doctor.evidence.errors import RuleError, UserError
from doctor.mcp.tools import ToolResult, ToolSpec, tool_table

INSTRUCTIONS = (
    "mldoctor diagnoses hung, slow, crashed and diverging PyTorch jobs. Call `diagnose` first with the "
    "path of the evidence (a bundle, a folder of logs/dumps, a ticket file) or with `text` (a pasted log "
    "or ticket). Read `verdict`, then `findings` (most likely first: `cause`, culprit `ranks`/`hosts`/`gpus`, "
    "`evidence`, `fix`). `explain` gives a cause's playbook; `read_evidence` lists and shows the files "
    "behind a finding. Every tool is read-only."
)


def _one_line(exc: BaseException) -> str:
    """The message an agent gets for a failed call: one line, never a traceback."""
    if isinstance(exc, (UserError, RuleError)):
        text = str(exc)
    else:
        text = f"internal error: {type(exc).__name__}: {exc} (a bug in mldoctor; please report it)"
    from doctor.evidence.redact import scrub

    return scrub(" ".join(text.split()))[:1000] or type(exc).__name__


def call(spec: ToolSpec | None, name: str, arguments: dict[str, Any] | None, allow_live: bool) -> ToolResult:
    """Run one tool by name (synchronously); errors raise UserError with the line to show."""
    if spec is None:
        if name == "diagnose_live" and not allow_live:
            raise UserError("live diagnosis is off: the user must start the server with `mldoctor mcp --allow-live`")
        raise UserError(f"unknown tool {name!r}")
    args = dict(arguments or {})
    known = set(spec.input_schema.get("properties", {}))
    extra = sorted(set(args) - known)
    if extra:
        raise UserError(f"{name}: unknown argument(s) {', '.join(extra)}; it takes {', '.join(sorted(known)) or 'none'}")
    return spec.run(args)


def build_server(allow_live: bool = False) -> Any:
    """The SDK server with mldoctor's tools (the SDK is imported here: only `mldoctor mcp` needs it)."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    specs = {s.name: s for s in tool_table(allow_live)}
    listed = [
        types.Tool(
            name=s.name, title=s.title, description=s.description,
            input_schema=s.input_schema, output_schema=s.output_schema,
            annotations=types.ToolAnnotations(title=s.title, read_only_hint=True, destructive_hint=False,
                                              idempotent_hint=not s.live, open_world_hint=s.live),
        )
        for s in specs.values()
    ]

    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            result = await anyio.to_thread.run_sync(call, specs.get(params.name), params.name,
                                                    params.arguments, allow_live)
        except Exception as exc:  # every failure is a tool error of one line
            if os.environ.get("MLDOCTOR_DEBUG"):
                import traceback

                traceback.print_exc(file=sys.stderr)
            return types.CallToolResult(content=[types.TextContent(type="text", text=_one_line(exc))], is_error=True)
        return types.CallToolResult(content=[types.TextContent(type="text", text=result.summary)],
                                    structured_content=result.structured)

    return Server("mldoctor", version=__version__, title="mldoctor", instructions=INSTRUCTIONS,
                  on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def serve(allow_live: bool = False) -> None:
    """Serve over stdin/stdout until the client closes them."""
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(allow_live)

    async def main() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(main)
