"""One module per command: what `ktm relay`, `check`, `backup`, `restore` and `compact` do once
their flags are parsed (relay/cli.py holds the flags)."""
