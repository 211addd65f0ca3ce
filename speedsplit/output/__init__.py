"""What a user reads: tables, plots and report from results (aggregate, plots, report), the
failed runs (failed) and the run's closing summary (summary)."""
