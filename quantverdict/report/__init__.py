"""Run records (JSON) written by the CLI and the pytest plugin."""
