"""Model knowledge: the architecture registry, the bundled catalog, name/folder/Hub resolution and the profiles the planner sizes."""
