"""``python -m modelless.cli``: the same as the ``modelless`` command."""

from modelless.cli import main

main()
