"""The pure gang planner: place every member of a gang at once, and the sibling-affinity tiers."""
