"""searchrl.viewer: the local trajectory viewer web page (`searchrl view RUN`)."""
