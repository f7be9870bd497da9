"""Passes: one per work-queue key. A pass reads views, decides with the pure core and
hands its writes to writers; passes never import each other (they meet in the wiring)."""
