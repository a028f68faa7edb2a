"""Node scoring for prioritize (0-10), composed by weights from small pure components."""
