"""Developer scripts. A package only so that `python -m scripts.bench` runs from the repository
root (which -m puts first on sys.path, so `testbed` imports without path edits)."""
