"""``python -m meshant.sim``: run seeds of the colony simulator (see ``meshant.sim``)."""

from meshant.sim.cli import main

main()
