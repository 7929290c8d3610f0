"""tower-train's front: models, building the towers, command-line tools."""
