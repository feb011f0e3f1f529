"""The `dppo` command: one module per subcommand, and the parser."""
