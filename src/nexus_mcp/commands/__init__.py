"""CLI subcommands, one module per noun; cli.py assembles them."""
