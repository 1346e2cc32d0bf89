"""tqbridge.tools: the `tqbridge` command line (thin: parse, call, print)."""
