"""Small pieces every room uses: dataclass configs from YAML, atomic file writes, the run manifest."""
