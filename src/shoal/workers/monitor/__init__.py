"""`monitor_mcp` tasks: a long-lived MCP client writing what a server says."""
