"""What was served: recorded request shapes, traces (recorded and synthetic), usage summaries."""
